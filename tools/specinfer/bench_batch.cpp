#include "bench_batch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace {

struct Slot {
  specinfer_target *target = nullptr;
  specinfer_drafter *drafter = nullptr;
  specinfer_session *session = nullptr;
  size_t prompt = 0;
  std::vector<int32_t> text, room;
};

void close_session(Slot &s, BatchRun *out) {
  specinfer_session_stats st;
  specinfer_session_stats_init(&st);
  if (specinfer_session_get_stats(s.session, &st) == SPECINFER_OK) {
    out->rounds += st.n_rounds;
    out->drafted += st.n_drafted;
    out->accepted += st.n_accepted;
    out->prefill_ms += st.t_prefill_ms;
    out->draft_ms += st.t_draft_ms;
  }
  specinfer_session_destroy(s.session);
  s.session = nullptr;
}

}  // namespace

bool run_batched(specinfer_registry *reg, specinfer_target *target, const std::string &drafter_spec,
                 const specinfer_coupler *coupler, const cli::RunOptions &o,
                 const std::vector<std::string> &prompts, int32_t batch, int32_t prefill_chunk,
                 BatchRun *out) {
  *out = BatchRun{};
  out->outputs.resize(prompts.size());
  std::vector<Slot> slots(static_cast<size_t>(std::max<int32_t>(batch, 1)));
  bool ok = true;
  char *err = nullptr;
  for (Slot &s : slots) {
    if (specinfer_target_share(target, &s.target, &err) != SPECINFER_OK) {
      std::fprintf(stderr, "specinfer bench: cannot share the target: %s\n", err);
      ok = false;
      break;
    }
    if (!drafter_spec.empty() &&
        cli::open_drafter(reg, drafter_spec, s.target, &s.drafter, &err) != SPECINFER_OK) {
      std::fprintf(stderr, "specinfer bench: cannot open drafter '%s': %s\n", drafter_spec.c_str(),
                   err);
      ok = false;
      break;
    }
  }
  specinfer_free(err);
  err = nullptr;

  const specinfer_session_params params = cli::session_params(o);
  specinfer_step_params step;
  specinfer_step_params_init(&step);
  step.prefill_chunk = prefill_chunk;
  size_t next = 0, finished = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (ok && finished < prompts.size()) {
    // Free slots take the next prompts.
    for (Slot &s : slots) {
      if (s.session || next >= prompts.size()) continue;
      if (specinfer_session_create(s.target, s.drafter, coupler, &params, &s.session, &err) !=
          SPECINFER_OK) {
        std::fprintf(stderr, "specinfer bench: cannot create a session: %s\n", err);
        specinfer_free(err);
        err = nullptr;
        ok = false;
        break;
      }
      s.prompt = next++;
      s.text.clear();
      s.room.resize(static_cast<size_t>(o.max_draft) + 1);
      const std::string &p = prompts[s.prompt];
      if (specinfer_session_feed_text(s.session, p.data(), p.size()) != SPECINFER_OK) {
        std::fprintf(stderr, "specinfer bench: prompt %zu: %s\n", s.prompt + 1,
                     specinfer_session_errmsg(s.session));
        ok = false;
        break;
      }
    }
    if (!ok) break;
    std::vector<specinfer_session *> active;
    std::vector<specinfer_step_result> results;
    std::vector<Slot *> owners;
    for (Slot &s : slots) {
      if (!s.session) continue;
      specinfer_step_result r{};
      r.struct_size = sizeof r;
      r.tokens = s.room.data();
      r.cap = s.room.size();
      active.push_back(s.session);
      results.push_back(r);
      owners.push_back(&s);
    }
    specinfer_session_step_many(active.data(), results.data(), active.size(), &step);
    tally_step(active.data(), results.data(), active.size(), &out->step);
    for (size_t k = 0; k < owners.size(); ++k) {
      Slot &s = *owners[k];
      if (results[k].status != SPECINFER_OK) {
        std::fprintf(stderr, "specinfer bench: prompt %zu: %s\n", s.prompt + 1,
                     specinfer_session_errmsg(s.session));
        ok = false;
        continue;
      }
      s.text.insert(s.text.end(), results[k].tokens, results[k].tokens + results[k].n_tokens);
      if (results[k].done || s.text.size() >= static_cast<size_t>(o.max_tokens)) {
        s.text.resize(std::min(s.text.size(), static_cast<size_t>(o.max_tokens)));
        out->generated += static_cast<int64_t>(s.text.size());
        out->outputs[s.prompt] = s.text;
        close_session(s, out);
        ++finished;
      }
    }
  }
  out->wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (Slot &s : slots) {
    if (s.session) close_session(s, out);
    specinfer_drafter_destroy(s.drafter);
    specinfer_target_destroy(s.target);
  }
  return ok;
}
