#include "step_tally.h"

bool tally_step(specinfer_session *const *sessions, const specinfer_step_result *results, size_t n,
                StepTally *tally) {
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    specinfer_round_info info;
    specinfer_round_info_init(&info);
    if (results[i].status != SPECINFER_OK || results[i].n_tokens == 0 ||
        specinfer_session_round_info(sessions[i], &info) != SPECINFER_OK)
      continue;  // failed, or scored a chunk of its prompt
    tally->rounds++;
    tally->budget += info.draft_budget;
    tally->drafted += info.n_drafted;
    tally->tokens += static_cast<int64_t>(results[i].n_tokens);
    if (!any) {
      any = true;
      tally->steps++;
      tally->pass_ms += info.pass_ms;
      tally->predicted_pass_ms += info.predicted_pass_ms;
      tally->goodput = info.goodput;
      tally->plain_goodput = info.plain_goodput;
    }
  }
  return any;
}
