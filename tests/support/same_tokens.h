// Comparing a speculative run's tokens with plain decoding's, for the C++ end-to-end tests.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "support/cmocka_setup.h"

// Fails the test when `got` differs from `want`, first printing `what` (the drafter, coupler ...),
// the first differing token, both lengths and the prompt's start.
inline void expect_same_tokens(const std::vector<int32_t> &want, const std::vector<int32_t> &got,
                               const std::string &what, const char *prompt) {
  if (want != got) {
    size_t i = 0;
    while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
    std::fprintf(stderr,
                 "%s: differs from plain decoding at token %zu (lengths %zu, %zu) on prompt "
                 "'%.30s'\n",
                 what.c_str(), i, want.size(), got.size(), prompt);
  }
  assert_true(want == got);
}
