// serve::Worker: one session at a time, requests from a bounded queue (serve_engine.h).
#include "serve_engine.h"

#include <utility>
#include <vector>

namespace serve {

namespace {

// Token ids -> text; "" when the target cannot say.
std::string token_text(specinfer_target *target, int32_t token) {
  if (token < 0) return "";
  char buf[256];
  size_t n = 0;
  if (specinfer_target_detokenize(target, &token, 1, buf, sizeof buf, &n) != SPECINFER_OK)
    return "";
  return std::string(buf, n);
}

// Where a request's session sends each round: to the request's callbacks, with the end-of-text
// token's text cut off, stopping when the request is cancelled or the callback says so.
struct RoundSink {
  const GenCallbacks *callbacks;
  const std::atomic<bool> *cancelled;
  const specinfer_model_info *info;
  const std::string *end_text;  // [2]: eos, eot
  int32_t n_tokens = 0;
  bool ended = false;    // an end-of-text token came
  bool stopped = false;  // the callback asked to stop
};

int on_round(void *user, const int32_t *tokens, size_t n, const char *text, size_t len) {
  auto *sink = static_cast<RoundSink *>(user);
  sink->n_tokens += static_cast<int32_t>(n);
  std::string piece(text, len);
  if (n > 0) {
    const int32_t last = tokens[n - 1];
    for (int i = 0; i < 2; ++i) {
      const int32_t id = i == 0 ? sink->info->eos_token : sink->info->eot_token;
      const std::string &end = sink->end_text[i];
      if (id >= 0 && last == id) {
        sink->ended = true;
        if (!end.empty() && piece.size() >= end.size() &&
            piece.compare(piece.size() - end.size(), end.size(), end) == 0)
          piece.resize(piece.size() - end.size());
        break;
      }
    }
  }
  if (sink->cancelled->load()) return 1;
  if (!sink->callbacks->on_text(piece, static_cast<int32_t>(n))) {
    sink->stopped = true;
    return 1;
  }
  return 0;
}

}  // namespace

Worker::Worker(specinfer_target *target, specinfer_drafter *drafter,
               const specinfer_session_params &defaults, int32_t max_queue)
    : target_(target), drafter_(drafter), defaults_(defaults), max_queue_(max_queue) {
  specinfer_model_info_init(&info_);
  specinfer_target_info(target_, &info_);
  end_text_[0] = token_text(target_, info_.eos_token);
  end_text_[1] = token_text(target_, info_.eot_token);
  thread_ = std::thread([this] { loop(); });
}

Worker::~Worker() {
  stop();
  if (thread_.joinable()) thread_.join();
}

SubmitStatus Worker::submit(GenParams params, GenCallbacks callbacks,
                            std::shared_ptr<std::atomic<bool>> cancelled) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) return SubmitStatus::kStopped;
  // max_queue_ counts waiting requests: an idle worker takes one even with max_queue_ == 0.
  const bool idle = queue_.empty() && metrics_.running == 0;
  if (static_cast<int32_t>(queue_.size()) >= max_queue_ && !idle) {
    metrics_.requests_rejected++;
    return SubmitStatus::kQueueFull;
  }
  queue_.push_back(Job{std::move(params), std::move(callbacks), std::move(cancelled)});
  metrics_.queue_depth = static_cast<int32_t>(queue_.size());
  wake_.notify_one();
  return SubmitStatus::kQueued;
}

EngineMetrics Worker::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return metrics_;
}

void Worker::stop() {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
    metrics_.queue_depth = 0;
    if (running_cancel_) running_cancel_->store(true);
    wake_.notify_one();
  }
  GenResult cancelled;
  cancelled.kind = GenResult::Kind::kCancelled;
  for (Job &job : dropped) job.callbacks.on_done(cancelled);
}

void Worker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      metrics_.queue_depth = static_cast<int32_t>(queue_.size());
      metrics_.running = 1;
      running_cancel_ = job.cancelled;
    }
    GenResult result = run(job);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      metrics_.running = 0;
      running_cancel_.reset();
      switch (result.kind) {
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
    job.callbacks.on_done(result);
  }
}

GenResult Worker::run(Job &job) {
  GenResult result;
  if (job.cancelled->load()) {
    result.kind = GenResult::Kind::kCancelled;
    return result;
  }
  const GenParams &p = job.params;
  // Count the prompt's tokens first (as feed_text will tokenize it: special tokens parsed, bos
  // added when the model asks), so that a prompt that leaves no room is refused with the numbers.
  size_t n_prompt = 0;
  specinfer_status rc = specinfer_target_tokenize(target_, p.prompt.data(), p.prompt.size(), 1, 1,
                                                  nullptr, 0, &n_prompt);
  if (rc == SPECINFER_ERR_BUFFER_TOO_SMALL || rc == SPECINFER_OK) {
    std::vector<int32_t> ids(n_prompt);
    rc = specinfer_target_tokenize(target_, p.prompt.data(), p.prompt.size(), 1, 1, ids.data(),
                                   ids.size(), &n_prompt);
  }
  if (rc != SPECINFER_OK) {
    result.kind = GenResult::Kind::kBadRequest;
    result.message = std::string("cannot tokenize the prompt: ") + specinfer_target_errmsg(target_);
    return result;
  }
  if (n_prompt >= static_cast<size_t>(info_.n_ctx)) {
    result.kind = GenResult::Kind::kBadRequest;
    result.message = "the prompt has " + std::to_string(n_prompt) +
                     " tokens, but the context holds " + std::to_string(info_.n_ctx) +
                     " (prompt and completion together)";
    result.prompt_tokens = static_cast<int32_t>(n_prompt);
    return result;
  }

  specinfer_session_params sp = defaults_;
  sp.temperature = p.temperature;
  sp.top_p = p.top_p;
  sp.seed = p.seed;
  specinfer_session *session = nullptr;
  char *err = nullptr;
  if (specinfer_session_create(target_, drafter_, nullptr, &sp, &session, &err) != SPECINFER_OK) {
    result.kind = GenResult::Kind::kFailed;
    result.message = std::string("cannot create a session: ") + (err ? err : "?");
    specinfer_free(err);
    return result;
  }
  RoundSink sink{&job.callbacks, job.cancelled.get(), &info_, end_text_};
  rc = specinfer_session_feed_text(session, p.prompt.data(), p.prompt.size());
  if (rc == SPECINFER_OK) {
    specinfer_session_stats st;
    specinfer_session_stats_init(&st);
    specinfer_session_get_stats(session, &st);
    result.prompt_tokens = static_cast<int32_t>(st.n_prompt_tokens);
    if (job.callbacks.on_start) job.callbacks.on_start(result.prompt_tokens);
    rc = specinfer_session_generate(session, p.max_tokens, on_round, &sink);
  }
  result.completion_tokens = sink.n_tokens;
  if (rc == SPECINFER_OK || rc == SPECINFER_ERR_CONTEXT_FULL ||
      (rc == SPECINFER_ERR_CANCELLED && sink.stopped)) {
    result.finish_reason = sink.ended || sink.stopped ? "stop" : "length";
  } else if (rc == SPECINFER_ERR_CANCELLED) {
    result.kind = GenResult::Kind::kCancelled;
  } else {
    result.kind = GenResult::Kind::kFailed;
    result.message = specinfer_session_errmsg(session);
  }

  specinfer_session_stats st;
  specinfer_session_stats_init(&st);
  specinfer_session_get_stats(session, &st);
  specinfer_session_destroy(session);
  std::lock_guard<std::mutex> lock(mutex_);
  metrics_.prompt_tokens += st.n_prompt_tokens;
  metrics_.generated_tokens += st.n_generated;
  metrics_.drafted += st.n_drafted;
  metrics_.accepted += st.n_accepted;
  metrics_.rounds += st.n_rounds;
  metrics_.round_seconds += (st.t_total_ms - st.t_prefill_ms) / 1000.0;
  metrics_.prefill_seconds += st.t_prefill_ms / 1000.0;
  return result;
}

}  // namespace serve
