// Stepping sessions together through the public ABI (specinfer_session_step_many), for the tests
// that compare what sessions emit in a shared pass with what each emits alone (C++, header-only;
// include after cmocka_setup.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "specinfer.h"
#include "support/cmocka_setup.h"

// Steps the sessions s[i] whose tokens got[i] are still short of want[i] together, one call of
// specinfer_session_step_many with `params` per step, until none is: appends each result's tokens
// to got[i] (cut at want[i] when the result ends the text) and calls on_result(step, i, result)
// for each session of the step. Fails the test when a step fails or more than max_steps are
// needed; returns the steps taken.
template <typename OnResult>
int step_together(const std::vector<specinfer_session *> &s, std::vector<std::vector<int32_t>> &got,
                  const std::vector<size_t> &want, const specinfer_step_params &params,
                  int max_steps, OnResult &&on_result) {
  std::vector<std::vector<int32_t>> room(s.size(), std::vector<int32_t>(64));
  int steps = 0;
  for (;; ++steps) {
    std::vector<specinfer_session *> active;
    std::vector<specinfer_step_result> results;
    std::vector<size_t> which;
    for (size_t i = 0; i < s.size(); ++i) {
      if (got[i].size() >= want[i]) continue;
      specinfer_step_result r{};
      r.struct_size = sizeof r;
      r.tokens = room[i].data();
      r.cap = room[i].size();
      active.push_back(s[i]);
      results.push_back(r);
      which.push_back(i);
    }
    if (active.empty()) return steps;
    const specinfer_status rc =
        specinfer_session_step_many(active.data(), results.data(), active.size(), &params);
    if (rc != SPECINFER_OK) std::fprintf(stderr, "step_many: %s\n", specinfer_status_str(rc));
    assert_int_equal(rc, SPECINFER_OK);
    for (size_t k = 0; k < which.size(); ++k) {
      const size_t i = which[k];
      assert_int_equal(results[k].status, SPECINFER_OK);
      got[i].insert(got[i].end(), results[k].tokens, results[k].tokens + results[k].n_tokens);
      if (results[k].done) got[i].resize(std::min(got[i].size(), want[i]));
      on_result(steps, i, results[k]);
    }
    assert_true(steps < max_steps);
  }
}
