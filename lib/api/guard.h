// Runs core code at the C boundary: exceptions become a status code plus a message.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "../../common/fault_point.h"
#include "specinfer.h"
#include "util/error.h"

namespace specinfer {

// Copies `msg` into a malloc'd string for a `char **errmsg` out-parameter (NULL-safe).
inline void set_errmsg(char **errmsg, const std::string &msg) {
  if (!errmsg) return;
  *errmsg =
      fault_injected(FAULT_ALLOC) ? nullptr : static_cast<char *>(std::malloc(msg.size() + 1));
  if (*errmsg) std::memcpy(*errmsg, msg.c_str(), msg.size() + 1);
}

// Sets msg (empty) to what build() returns; when that needs memory that is refused, to "out of
// memory", which fits the string's own buffer and so needs none.
template <typename Build>
void set_message(std::string &msg, Build &&build) noexcept {
  try {
    msg = build();
  } catch (...) {
    msg.assign("out of memory");
  }
}

// Calls fn(); on an exception stores the message in *last (if not NULL) and *errmsg (if not NULL)
// and returns its status. On success clears both. Nothing here throws, even with no memory left:
// a message that cannot be copied is cut to what *last has room for, and *errmsg is then NULL.
template <typename F>
specinfer_status guard(std::string *last, char **errmsg, F &&fn) noexcept {
  specinfer_status rc = SPECINFER_OK;
  std::string msg;
  try {
    fn();
  } catch (const Error &e) {
    rc = e.code();
    set_message(msg, [&] { return std::string(e.what()); });
  } catch (const std::bad_alloc &) {
    rc = SPECINFER_ERR_OUT_OF_MEMORY;
    msg.assign("out of memory");
  } catch (const std::exception &e) {
    rc = SPECINFER_ERR_INTERNAL;
    set_message(msg, [&] { return std::string("internal error: ") + e.what(); });
  } catch (...) {
    rc = SPECINFER_ERR_INTERNAL;
    set_message(msg, [] { return std::string("internal error: unknown exception"); });
  }
  if (last) {
    try {
      *last = msg;
    } catch (...) {
      last->clear();
      last->append(msg, 0, std::min(msg.size(), last->capacity()));
    }
  }
  if (errmsg) {
    *errmsg = nullptr;
    if (rc != SPECINFER_OK) set_errmsg(errmsg, msg);
  }
  return rc;
}

}  // namespace specinfer
