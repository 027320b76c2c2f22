// What the rounds of batched steps (specinfer_session_step_many calls) drafted and cost, summed
// from their sessions' specinfer_session_round_info: `bench --batch` prints it per run, the
// server reports it in /metrics.
#pragma once

#include <cstddef>
#include <cstdint>

#include "specinfer.h"

struct StepTally {
  int64_t steps = 0;    // steps in which some session ran a round (not only prompt chunks)
  int64_t rounds = 0;   // the sessions' rounds in them
  int64_t budget = 0;   // tokens the draft budget let those rounds draft
  int64_t drafted = 0;  // tokens they drafted
  int64_t tokens = 0;   // tokens they emitted
  // The steps' shared passes: measured, and predicted from the model's pass costs before each ran.
  double pass_ms = 0, predicted_pass_ms = 0;
  // The last step's plan (tokens/s expected with the drafts chosen, and with none; 0 alone).
  double goodput = 0, plain_goodput = 0;
};

// Adds one step over sessions[0, n) with their results to *tally: the rounds of the sessions
// whose call succeeded with tokens, and the step's pass once (every session of a shared pass
// reports the same). Returns false, adding nothing, when no session ran a round.
bool tally_step(specinfer_session *const *sessions, const specinfer_step_result *results, size_t n,
                StepTally *tally);
