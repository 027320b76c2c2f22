// serve::Worker: requests from a bounded queue, stepped together in slots (serve_engine.h).
#include "serve_engine.h"

#include "cli_options.h"
#include "serve_chat.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>
#include <vector>

namespace serve {

namespace {

GenResult with_kind(GenResult::Kind kind, std::string message = "") {
  GenResult r;
  r.kind = kind;
  r.message = std::move(message);
  return r;
}

}  // namespace

std::unique_ptr<Worker> Worker::create(specinfer_registry *reg, specinfer_target *target,
                                       const Options &options, std::string *error) {
  std::unique_ptr<Worker> w(new Worker(reg, target, options));
  char *err = nullptr;
  if (specinfer_coupler_create("gumbel", &w->sampled_coupler_, &err) != SPECINFER_OK) {
    *error = std::string("cannot create the coupler: ") + (err ? err : "?");
    specinfer_free(err);
    return nullptr;
  }
  for (Slot &s : w->slots_) {
    if (specinfer_target_share(target, &s.target, &err) != SPECINFER_OK) {
      *error = std::string("cannot share the target: ") + (err ? err : "?");
      specinfer_free(err);
      return nullptr;
    }
    if (!options.drafter_spec.empty() &&
        cli::open_drafter(reg, options.drafter_spec, s.target, &s.drafter, &err) != SPECINFER_OK) {
      *error = std::string("cannot open drafter: ") + (err ? err : "?");
      specinfer_free(err);
      return nullptr;
    }
  }
  w->thread_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

Worker::Worker(specinfer_registry *reg, specinfer_target *target, const Options &options)
    : reg_(reg),
      target_(target),
      options_(options),
      slots_(static_cast<size_t>(std::max(options.parallel, 1))) {
  specinfer_model_info_init(&info_);
  specinfer_target_info(target_, &info_);
}

Worker::~Worker() {
  stop();
  if (thread_.joinable()) thread_.join();
  for (Slot &s : slots_) {
    specinfer_session_destroy(s.session);
    specinfer_constraint_destroy(s.constraint);
    specinfer_drafter_destroy(s.drafter);
    specinfer_target_destroy(s.target);
  }
  for (Compiled &c : compiled_) specinfer_constraint_destroy(c.constraint);
  specinfer_coupler_destroy(sampled_coupler_);
}

SubmitStatus Worker::submit(std::vector<GenJob> jobs,
                            std::shared_ptr<std::atomic<bool>> cancelled) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) return SubmitStatus::kStopped;
  int32_t choices = 0;
  for (const GenJob &j : jobs) {
    if (j.params.n < 1 || j.params.n > static_cast<int32_t>(slots_.size()))
      return SubmitStatus::kTooManyChoices;
    choices += j.params.n;
  }
  // max_queue counts waiting jobs: free slots take them even with max_queue == 0.
  const bool room =
      queue_.empty() && metrics_.running + choices <= static_cast<int32_t>(slots_.size());
  if (queue_.size() + jobs.size() > static_cast<size_t>(options_.max_queue) && !room) {
    metrics_.requests_rejected++;
    return SubmitStatus::kQueueFull;
  }
  for (GenJob &j : jobs)
    queue_.push_back(
        std::make_shared<Job>(Job{std::move(j.params), std::move(j.callbacks), cancelled, 0, {}}));
  metrics_.queue_depth = static_cast<int32_t>(queue_.size());
  wake_.notify_one();
  return SubmitStatus::kQueued;
}

EngineMetrics Worker::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return metrics_;
}

void Worker::stop() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
    metrics_.queue_depth = 0;
    wake_.notify_one();
  }
  for (const auto &job : dropped)
    for (int32_t i = 0; i < job->params.n; ++i)
      job->callbacks.on_done(i, with_kind(GenResult::Kind::kCancelled));
}

bool Worker::tokenize(const std::string &text, bool add_special, std::vector<int32_t> *ids,
                      std::string *error) {
  std::lock_guard<std::mutex> lock(target_mutex_);
  if (serve::tokenize(target_, text, add_special, ids) == SPECINFER_OK) return true;
  *error = std::string("cannot tokenize: ") + specinfer_target_errmsg(target_);
  return false;
}

bool Worker::detokenize(const std::vector<int32_t> &ids, std::string *text, std::string *error) {
  std::lock_guard<std::mutex> lock(target_mutex_);
  for (const int32_t id : ids)
    if (id < 0 || id >= info_.vocab_size) {
      *error = "token " + std::to_string(id) + " is outside the vocabulary (size " +
               std::to_string(info_.vocab_size) + ")";
      return false;
    }
  if (serve::detokenize(target_, ids, text) == SPECINFER_OK) return true;
  *error = std::string("cannot detokenize: ") + specinfer_target_errmsg(target_);
  return false;
}

specinfer_constraint *Worker::open_constraint(const std::string &kind, const std::string &grammar,
                                              std::string *error) {
  std::lock_guard<std::mutex> lock(target_mutex_);
  auto it = std::find_if(compiled_.begin(), compiled_.end(),
                         [&](const Compiled &c) { return c.kind == kind && c.grammar == grammar; });
  char *err = nullptr;
  if (it == compiled_.end()) {
    Compiled c{kind, grammar, nullptr};
    if (specinfer_constraint_open(reg_, "llguidance", nullptr, target_, kind.c_str(),
                                  grammar.c_str(), &c.constraint, &err) != SPECINFER_OK) {
      *error = err ? err : "cannot open the constraint";
      specinfer_free(err);
      return nullptr;
    }
    if (compiled_.size() >= kMaxCompiled) {
      specinfer_constraint_destroy(compiled_.front().constraint);
      compiled_.erase(compiled_.begin());
    }
    compiled_.push_back(std::move(c));
  } else {
    std::rotate(it, it + 1, compiled_.end());  // most recently used last
  }
  specinfer_constraint *fork = nullptr;
  if (specinfer_constraint_fork(compiled_.back().constraint, &fork, &err) != SPECINFER_OK) {
    *error = err ? err : "cannot fork the constraint";
    specinfer_free(err);
    return nullptr;
  }
  return fork;
}

bool Worker::start(Slot &slot, Slot *source) {
  slot.result = GenResult{};
  GenResult &result = slot.result;
  if (slot.job->cancelled->load()) {
    result.kind = GenResult::Kind::kCancelled;
    return false;
  }
  if (source) {  // the prompt, as choice 0 scored it
    if (!open_session(slot)) return false;
    result.prompt_tokens = slot.job->prompt_tokens;
    if (specinfer_session_feed_from(slot.session, source->session,
                                    static_cast<size_t>(slot.job->prompt_tokens)) != SPECINFER_OK) {
      result = with_kind(GenResult::Kind::kFailed, specinfer_session_errmsg(slot.session));
      return false;
    }
    return true;
  }
  const GenParams &p = slot.job->params;
  // Count the prompt's tokens first (as feed_text will tokenize it: special tokens parsed, bos
  // added when the model asks), so that a prompt that leaves no room is refused with the numbers.
  std::vector<int32_t> ids = slot.job->prompt_ids;  // admit's
  if (ids.empty() && serve::tokenize(slot.target, p.prompt, true, &ids) != SPECINFER_OK) {
    result = with_kind(GenResult::Kind::kBadRequest, std::string("cannot tokenize the prompt: ") +
                                                         specinfer_target_errmsg(slot.target));
    return false;
  }
  if (ids.size() >= static_cast<size_t>(info_.n_ctx)) {
    result = with_kind(GenResult::Kind::kBadRequest,
                       "the prompt has " + std::to_string(ids.size()) +
                           " tokens, but the context holds " + std::to_string(info_.n_ctx) +
                           " (prompt and completion together)");
    result.prompt_tokens = static_cast<int32_t>(ids.size());
    return false;
  }
  if (!open_session(slot)) return false;
  const specinfer_status rc =
      p.prompt_tokens.empty()
          ? specinfer_session_feed_text(slot.session, p.prompt.data(), p.prompt.size())
          : specinfer_session_feed_tokens(slot.session, ids.data(), ids.size());
  if (rc != SPECINFER_OK) {
    // Token ids outside the vocabulary are the client's; anything else the server's.
    result = with_kind(rc == SPECINFER_ERR_INVALID_ARGUMENT ? GenResult::Kind::kBadRequest
                                                            : GenResult::Kind::kFailed,
                       specinfer_session_errmsg(slot.session));
    return false;
  }
  slot.job->prompt_tokens = result.prompt_tokens = static_cast<int32_t>(ids.size());
  if (slot.job->callbacks.on_start) {
    std::string text = p.prompt;
    if (!p.prompt_tokens.empty()) serve::detokenize(slot.target, ids, &text);  // "" if it fails
    slot.job->callbacks.on_start(result.prompt_tokens, text);
  }
  return true;
}

bool Worker::open_session(Slot &slot) {
  const GenParams &p = slot.job->params;
  GenResult &result = slot.result;
  specinfer_session_params sp = options_.defaults;
  sp.temperature = p.temperature;
  sp.top_p = p.top_p;
  sp.seed = p.seed + static_cast<uint64_t>(slot.choice);
  char *err = nullptr;
  specinfer_coupler *coupler = sp.temperature > 0.0f ? sampled_coupler_ : nullptr;
  if (specinfer_session_create(slot.target, slot.drafter, coupler, &sp, &slot.session, &err) !=
      SPECINFER_OK) {
    result = with_kind(GenResult::Kind::kFailed,
                       std::string("cannot create a session: ") + (err ? err : "?"));
    specinfer_free(err);
    return false;
  }
  slot.room.resize(static_cast<size_t>(sp.max_draft) + 1);
  if (!p.constraint_kind.empty()) {
    std::string why;
    slot.constraint = open_constraint(p.constraint_kind, p.constraint, &why);
    if (!slot.constraint || specinfer_session_set_constraint(slot.session, slot.constraint)) {
      if (slot.constraint) why = specinfer_session_errmsg(slot.session);
      result = with_kind(GenResult::Kind::kBadRequest, p.constraint_param + ": " + why);
      result.param = p.constraint_param;
      return false;
    }
  }
  if ((p.logprobs >= 0 &&
       specinfer_session_set_logprobs(slot.session, p.logprobs) != SPECINFER_OK) ||
      (p.prompt_logprobs && slot.choice == 0 &&
       specinfer_session_set_prompt_logprobs(slot.session, std::max(p.logprobs, 0)) !=
           SPECINFER_OK)) {
    result = with_kind(GenResult::Kind::kBadRequest, specinfer_session_errmsg(slot.session));
    result.param = "logprobs";
    return false;
  }
  std::vector<const char *> stops;
  for (const std::string &x : p.stop) stops.push_back(x.c_str());
  if (specinfer_session_set_stop_strings(slot.session, stops.data(), stops.size()) !=
      SPECINFER_OK) {
    result = with_kind(GenResult::Kind::kBadRequest, specinfer_session_errmsg(slot.session));
    return false;
  }
  return true;
}

void Worker::finish(Slot &slot) {
  specinfer_session_stats st;
  specinfer_session_stats_init(&st);
  slot.text.clear();
  if (slot.session) {
    specinfer_session_get_stats(slot.session, &st);
    const int32_t *text = nullptr;
    size_t len = 0;
    if (specinfer_session_tokens(slot.session, &text, &len) == SPECINFER_OK)
      slot.text.assign(text, text + len);
  }
  specinfer_session_destroy(slot.session);
  slot.session = nullptr;
  specinfer_constraint_destroy(slot.constraint);
  slot.constraint = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Choices after the first take the prompt scored: it counts once.
    if (slot.choice == 0) {
      metrics_.prompt_tokens += st.n_prompt_tokens;
      slot.result.cached_tokens =
          static_cast<int32_t>(std::min<int64_t>(st.n_cached_tokens, slot.result.prompt_tokens));
      metrics_.cached_tokens += slot.result.cached_tokens;
    }
    metrics_.generated_tokens += st.n_generated;
    metrics_.drafted += st.n_drafted;
    metrics_.accepted += st.n_accepted;
    metrics_.rounds += st.n_rounds;
    metrics_.round_seconds += (st.t_total_ms - st.t_prefill_ms) / 1000.0;
    metrics_.prefill_seconds += st.t_prefill_ms / 1000.0;
    switch (slot.result.kind) {
      case GenResult::Kind::kOk:
        metrics_.requests_done++;
        break;
      case GenResult::Kind::kCancelled:
        metrics_.requests_cancelled++;
        break;
      default:
        metrics_.requests_failed++;
        break;
    }
  }
  const std::shared_ptr<Job> job = std::move(slot.job);
  slot.job.reset();
  slot.source = nullptr;
  job->callbacks.on_done(slot.choice, slot.result);
}

void Worker::start_waiting(Slot &source, bool scored) {
  for (Slot &s : slots_) {
    if (s.source != &source) continue;
    s.source = nullptr;
    if (!scored) {
      s.result = source.result;
      finish(s);
    } else if (!start(s, &source)) {
      finish(s);
    }
  }
}

namespace {

// Tokens a free slot's cache must share with a prompt for the prompt to prefer that slot to the
// one used least recently.
constexpr size_t kMinSharedTokens = 32;

// How many tokens two texts share from their start.
size_t common_prefix(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

void Worker::admit(std::vector<std::shared_ptr<Job>> arrived) {
  for (const std::shared_ptr<Job> &job : arrived) {
    // Choice 0 takes the free slot whose cache holds the longest start of the prompt (a
    // conversation's earlier turn, a shared system prompt): its session scores only the rest.
    // Among slots that hold as much, the one used least recently.
    Job &j = *job;
    j.prompt_ids = j.params.prompt_tokens;
    Slot *first = nullptr;
    size_t best = 0;
    for (Slot &s : slots_) {
      if (s.job) continue;
      if (!first && j.prompt_ids.empty())
        serve::tokenize(s.target, j.params.prompt, true, &j.prompt_ids);
      // A few tokens in common (a bos, a heading's "#") are not worth another slot's cache.
      const size_t shared = common_prefix(s.text, j.prompt_ids);
      const size_t worth = shared >= kMinSharedTokens ? shared : 0;
      if (!first || worth > best || (worth == best && s.last_used < first->last_used)) {
        best = worth;
        first = &s;
      }
    }
    first->job = job;
    first->choice = 0;
    first->source = nullptr;
    first->prompt_logprobs_sent = false;
    first->last_used = ++uses_;
    int32_t choice = 1;
    for (Slot &s : slots_) {
      if (choice == j.params.n) break;
      if (s.job) continue;
      s.job = job;
      s.choice = choice++;
      s.source = first;
      s.prompt_logprobs_sent = false;
      s.last_used = ++uses_;
    }
    if (!start(*first, nullptr)) {
      start_waiting(*first, false);
      finish(*first);
    }
  }
}

namespace {

// Log-probability arrays from the session (n entries, top alternatives each) as the server's
// entries, end-of-generation tokens left out when skip_eog.
std::vector<TokenLogprob> token_logprobs(specinfer_target *target, const specinfer_model_info &info,
                                         const int32_t *tokens, const float *logprobs,
                                         const int32_t *top_tokens, const float *top_logprobs,
                                         size_t n, int32_t top, bool skip_eog) {
  std::vector<TokenLogprob> out;
  const int32_t *eog = info.eog_tokens;
  for (size_t i = 0; i < n; ++i) {
    if (skip_eog && std::find(eog, eog + info.n_eog_tokens, tokens[i]) != eog + info.n_eog_tokens)
      continue;
    TokenLogprob t;
    t.bytes = token_text(target, tokens[i]);
    t.logprob = logprobs[i];
    for (int32_t j = 0; j < top; ++j) {
      const size_t k = i * static_cast<size_t>(top) + static_cast<size_t>(j);
      t.top.emplace_back(token_text(target, top_tokens[k]), top_logprobs[k]);
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

std::vector<TokenLogprob> Worker::round_logprobs(const Slot &slot) const {
  if (slot.job->params.logprobs < 0) return {};
  const int32_t *tokens = nullptr, *top_tokens = nullptr;
  const float *logprobs = nullptr, *top_logprobs = nullptr;
  size_t n = 0;
  int32_t top = 0;
  if (specinfer_session_step_logprobs(slot.session, &tokens, &logprobs, &top_tokens, &top_logprobs,
                                      &n, &top) != SPECINFER_OK)
    return {};
  return token_logprobs(slot.target, info_, tokens, logprobs, top_tokens, top_logprobs, n, top,
                        true);
}

std::vector<TokenLogprob> Worker::prompt_logprobs(const Slot &slot) const {
  const int32_t *text = nullptr, *tokens = nullptr, *top_tokens = nullptr;
  const float *logprobs = nullptr, *top_logprobs = nullptr;
  size_t len = 0, n = 0;
  int32_t top = 0;
  if (specinfer_session_tokens(slot.session, &text, &len) != SPECINFER_OK || len == 0 ||
      specinfer_session_prompt_logprobs(slot.session, &tokens, &logprobs, &top_tokens,
                                        &top_logprobs, &n, &top) != SPECINFER_OK)
    return {};
  std::vector<TokenLogprob> out;
  // The first token has none. A bos that the model added to a text prompt is not the prompt's:
  // left out, so that the entries' bytes are the echoed text.
  const bool added_bos =
      slot.job->params.prompt_tokens.empty() && info_.add_bos && text[0] == info_.bos_token;
  if (!added_bos) {
    out.emplace_back();
    out[0].bytes = token_text(slot.target, text[0]);
    out[0].logprob = std::numeric_limits<float>::quiet_NaN();
  }
  for (TokenLogprob &t : token_logprobs(slot.target, info_, tokens, logprobs, top_tokens,
                                        top_logprobs, n, top, false))
    out.push_back(std::move(t));
  return out;
}

void Worker::count_step(const std::vector<specinfer_session *> &sessions,
                        const std::vector<specinfer_step_result> &results,
                        std::chrono::steady_clock::duration took) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (tally_step(sessions.data(), results.data(), sessions.size(), &metrics_.step))
    metrics_.step_seconds += std::chrono::duration<double>(took).count();
}

void Worker::loop() {
  specinfer_step_params step;
  specinfer_step_params_init(&step);
  step.prefill_chunk = options_.prefill_chunk;
  for (;;) {
    bool stopping = false;
    admit(take_arrivals(&stopping));
    const std::vector<Slot *> active = running_slots(stopping);
    if (active.empty()) {
      if (stopping) return;
      continue;
    }
    std::vector<specinfer_step_result> results(active.size());
    step_slots(active, step, results);
    // Choices waiting for a prompt start from it once its first tokens show it scored (before
    // anything below may end the session that holds it).
    for (size_t i = 0; i < active.size(); ++i)
      if (results[i].status == SPECINFER_OK && results[i].n_tokens > 0)
        start_waiting(*active[i], true);
    for (size_t i = 0; i < active.size(); ++i) deliver(*active[i], results[i]);
    // Requests that ended in this step no longer run (the gauge would otherwise keep them until
    // the next request arrives).
    int32_t running = 0;
    for (const Slot &s : slots_) running += s.session ? 1 : 0;
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_.running = running;
  }
}

std::vector<std::shared_ptr<Worker::Job>> Worker::take_arrivals(bool *stopping) {
  std::vector<std::shared_ptr<Job>> arrived;
  std::unique_lock<std::mutex> lock(mutex_);
  int32_t busy = 0;
  for (const Slot &s : slots_) busy += s.job ? 1 : 0;
  wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || busy > 0; });
  *stopping = stopping_;
  // In arrival order: a request whose choices do not all fit waits, and so do those after it.
  while (!*stopping && !queue_.empty() &&
         busy + queue_.front()->params.n <= static_cast<int32_t>(slots_.size())) {
    busy += queue_.front()->params.n;
    arrived.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  metrics_.queue_depth = static_cast<int32_t>(queue_.size());
  return arrived;
}

std::vector<Worker::Slot *> Worker::running_slots(bool stopping) {
  std::vector<Slot *> active;
  for (Slot &s : slots_) {
    if (!s.session) continue;
    if (stopping || s.job->cancelled->load()) {
      s.result.kind = GenResult::Kind::kCancelled;
      start_waiting(s, false);
      finish(s);
      continue;
    }
    active.push_back(&s);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  metrics_.running = static_cast<int32_t>(active.size());
  return active;
}

void Worker::step_slots(const std::vector<Slot *> &active, const specinfer_step_params &step,
                        std::vector<specinfer_step_result> &results) {
  std::vector<specinfer_session *> sessions;
  for (size_t i = 0; i < active.size(); ++i) {
    Slot &s = *active[i];
    sessions.push_back(s.session);
    specinfer_step_result &r = results[i];
    r = specinfer_step_result{};
    r.struct_size = sizeof r;
    r.tokens = s.room.data();
    // A round emits no more than the request has left.
    const int32_t left = s.job->params.max_tokens - s.result.completion_tokens;
    r.cap = std::min(s.room.size(), static_cast<size_t>(std::max(left, 1)));
  }
  const auto step_start = std::chrono::steady_clock::now();
  specinfer_session_step_many(sessions.data(), results.data(), sessions.size(), &step);
  count_step(sessions, results, std::chrono::steady_clock::now() - step_start);
}

void Worker::deliver(Slot &s, const specinfer_step_result &r) {
  GenResult &result = s.result;
  if (r.status == SPECINFER_ERR_CONTEXT_FULL) {
    result.finish_reason = "length";
    start_waiting(s, true);
    finish(s);
    return;
  }
  if (r.status != SPECINFER_OK) {
    result = with_kind(GenResult::Kind::kFailed, specinfer_session_errmsg(s.session));
    start_waiting(s, false);
    finish(s);
    return;
  }
  if (r.n_tokens == 0) return;  // the prompt is still being scored
  const char *round_text = nullptr;
  size_t round_len = 0;
  specinfer_session_step_text(s.session, &round_text, &round_len);
  std::string text(round_text ? round_text : "", round_len);
  result.completion_tokens += static_cast<int32_t>(r.n_tokens);
  const bool full = !r.done && result.completion_tokens >= s.job->params.max_tokens;
  if (full) {  // the text ends here: what was held back for the stop strings is the request's
    const char *tail = nullptr;
    size_t tail_len = 0;
    if (specinfer_session_end_text(s.session, &tail, &tail_len) == SPECINFER_OK)
      text.append(tail, tail_len);
  }
  if (s.job->params.prompt_logprobs && s.choice == 0 && !s.prompt_logprobs_sent) {
    s.prompt_logprobs_sent = true;
    if (s.job->callbacks.on_prompt_logprobs)
      s.job->callbacks.on_prompt_logprobs(prompt_logprobs(s));
  }
  const bool more =
      s.job->callbacks.on_text(s.choice, text, static_cast<int32_t>(r.n_tokens), round_logprobs(s));
  if (r.done || !more || full) {
    result.finish_reason = full && more ? "length" : "stop";
    finish(s);
  }
}

}  // namespace serve
