// Runs core code at the C boundary: exceptions become a status code plus a message.
#pragma once

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "specinfer.h"
#include "util/error.h"

namespace specinfer {

// Copies `msg` into a malloc'd string for a `char **errmsg` out-parameter (NULL-safe).
inline void set_errmsg(char **errmsg, const std::string &msg) {
  if (!errmsg) return;
  *errmsg = static_cast<char *>(std::malloc(msg.size() + 1));
  if (*errmsg) std::memcpy(*errmsg, msg.c_str(), msg.size() + 1);
}

// Calls fn(); on an exception stores the message in *last (if not NULL) and *errmsg (if not NULL)
// and returns its status. On success clears both.
template <typename F>
specinfer_status guard(std::string *last, char **errmsg, F &&fn) noexcept {
  specinfer_status rc = SPECINFER_OK;
  std::string msg;
  try {
    fn();
  } catch (const Error &e) {
    rc = e.code();
    msg = e.what();
  } catch (const std::bad_alloc &) {
    rc = SPECINFER_ERR_OUT_OF_MEMORY;
    msg = "out of memory";
  } catch (const std::exception &e) {
    rc = SPECINFER_ERR_INTERNAL;
    msg = std::string("internal error: ") + e.what();
  } catch (...) {
    rc = SPECINFER_ERR_INTERNAL;
    msg = "internal error: unknown exception";
  }
  try {
    if (last) *last = msg;
  } catch (...) {
  }
  if (errmsg) {
    *errmsg = nullptr;
    if (rc != SPECINFER_OK) set_errmsg(errmsg, msg);
  }
  return rc;
}

}  // namespace specinfer
