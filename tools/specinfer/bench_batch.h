// specinfer bench --batch: many users on one loaded model. The prompts run through `batch` slots,
// each a target shared from the bench's target (and a drafter of its own), whose sessions step
// together with specinfer_session_step_many; a slot whose text is done takes the next prompt
// (continuous batching). Tokens/s is the aggregate over the wall time, prompts included.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli_options.h"
#include "specinfer.h"
#include "step_tally.h"

struct BatchRun {
  double wall_ms = 0;
  int64_t generated = 0, rounds = 0, drafted = 0, accepted = 0;
  // Summed over the sessions: scoring prompts (the target's, and a drafter's catching up on the
  // text) and drafting, each spent outside the shared target passes.
  double prefill_ms = 0, draft_ms = 0;
  StepTally step;                             // what the steps' rounds drafted and cost
  std::vector<std::vector<int32_t>> outputs;  // per prompt, the first max_tokens generated
};

// Runs every prompt through `batch` slots on shares of `target` (drafter_spec "" = plain). Returns
// false after printing why (prefixed "specinfer bench: ") when a target, drafter or session
// cannot be made or a step fails.
bool run_batched(specinfer_registry *reg, specinfer_target *target, const std::string &drafter_spec,
                 const specinfer_coupler *coupler, const cli::RunOptions &o,
                 const std::vector<std::string> &prompts, int32_t batch, int32_t prefill_chunk,
                 BatchRun *out);
