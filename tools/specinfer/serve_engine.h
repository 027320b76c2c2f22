// What `specinfer serve` runs requests on: the Engine interface (the seam the HTTP layer sees) and
// Worker, a continuous-batching engine: one thread stepping every running request's session
// together, requests taken from a bounded queue in arrival order.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "specinfer.h"
#include "step_tally.h"

namespace serve {

// One emitted token's log-probability under the model, with its most likely alternatives.
struct TokenLogprob {
  std::string bytes;  // the token's text (bytes; may hold part of a UTF-8 character)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // alternatives, most likely first
};

// Most choices (`n`) one request may ask for.
constexpr int32_t kMaxChoices = 8;

// One generation request, its prompt already rendered to text (or given as token ids).
struct GenParams {
  std::string prompt;
  std::vector<int32_t> prompt_tokens;  // when not empty, the prompt (fed as is; `prompt` unused)
  // Choices: n continuations of the prompt, each a session of its own with seed + i; the prompt
  // is scored once, by choice 0, and the others take its scored positions
  // (specinfer_session_feed_from).
  int32_t n = 1;
  int32_t max_tokens = 128;
  float temperature = 0;
  float top_p = 1;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop strings (specinfer_session_set_stop_strings)
  // Log-probabilities of the generated tokens, with this many alternatives each (-1: none).
  int32_t logprobs = -1;
  // The prompt's tokens' log-probabilities too (a completion's echo with logprobs), with as many
  // alternatives: choice 0 scores every prompt token (specinfer_session_set_prompt_logprobs).
  bool prompt_logprobs = false;
  // A constraint on the generated text (specinfer_constraint_open with the llguidance plugin):
  // its kind ("" = none: "json_schema", "json_object", "regex" or "lark"), its grammar, and the
  // request field that gave it (named in the error when it does not compile).
  std::string constraint_kind, constraint, constraint_param;
};

// How a request's choice ended.
struct GenResult {
  enum class Kind { kOk, kBadRequest, kCancelled, kFailed };
  Kind kind = Kind::kOk;
  std::string message;        // why, for kBadRequest and kFailed
  std::string param;          // kBadRequest: the request field at fault ("" = the prompt)
  std::string finish_reason;  // kOk: "stop" (end of text, a stop string, or the callback stopped)
                              // or "length"
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;  // of the prompt, positions its slot's cache held (choice 0)
};

// Called on the engine's thread, in this order: on_start once when the prompt is accepted (not
// for a request refused or cancelled before it starts), then for each choice (0 .. n-1, their
// calls interleaved): on_text after every round with the new text (the session's step text:
// whole UTF-8 characters, the end-of-text token's own text and everything from a stop string on
// left out) and once more with the text held back for the stop strings when the choice reaches
// max_tokens, and on_done exactly once (for a request refused before it starts: once for every
// choice, with the same result). on_text returns false to end the choice (finish_reason "stop");
// with GenParams::logprobs, it gets the round's tokens' log-probabilities (end-of-generation
// tokens left out), else none. With GenParams::prompt_logprobs, on_prompt_logprobs comes once,
// before the first on_text: every prompt token, the first with a NaN log-probability and no
// alternatives (nothing precedes it).
struct GenCallbacks {
  // The prompt's token count and its text (a prompt of token ids decoded).
  std::function<void(int32_t prompt_tokens, const std::string &prompt_text)> on_start;
  std::function<bool(int32_t choice, const std::string &text, int32_t n_tokens,
                     std::vector<TokenLogprob> logprobs)>
      on_text;
  std::function<void(std::vector<TokenLogprob> logprobs)> on_prompt_logprobs;
  std::function<void(int32_t choice, const GenResult &)> on_done;
};

// Counters for /metrics, since the engine started.
struct EngineMetrics {
  int64_t requests_done = 0, requests_failed = 0, requests_cancelled = 0, requests_rejected = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, drafted = 0, accepted = 0;
  int64_t cached_tokens = 0;  // prompt tokens a slot's cache held (not scored again)
  int64_t rounds = 0;
  double round_seconds = 0;    // time in rounds after the prompt, summed
  double prefill_seconds = 0;  // time scoring prompts, summed
  int32_t queue_depth = 0;     // requests waiting
  int32_t running = 0;         // requests generating
  // The steps (one specinfer_session_step_many call for every running request) that ran rounds:
  // what their rounds drafted and cost, and their wall time (tokens over it: measured goodput).
  StepTally step;
  double step_seconds = 0;
};

// kTooManyChoices: GenParams::n is more than the engine runs at once.
enum class SubmitStatus { kQueued, kQueueFull, kStopped, kTooManyChoices };

// One prompt of a request, with what its choices report to.
struct GenJob {
  GenParams params;
  GenCallbacks callbacks;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Queues a request: a job per prompt, all of them or none (kQueueFull when the queue has no
  // room for every one). `cancelled` may be set from any thread: a queued job is then dropped, a
  // running one ends at the next round; on_done reports kCancelled.
  virtual SubmitStatus submit(std::vector<GenJob> jobs,
                              std::shared_ptr<std::atomic<bool>> cancelled) = 0;
  virtual EngineMetrics metrics() const = 0;
  // Ends the running request (as cancelled) and every queued one; submit() refuses afterwards.
  virtual void stop() = 0;
  // The model's tokenizer, from any thread: text to token ids (special-token text parsed; bos
  // added when add_special and the model asks), and ids back to text. False with *error set for
  // what the tokenizer refuses (an id outside the vocabulary).
  virtual bool tokenize(const std::string &text, bool add_special, std::vector<int32_t> *ids,
                        std::string *error) = 0;
  virtual bool detokenize(const std::vector<int32_t> &ids, std::string *text,
                          std::string *error) = 0;
};

// Runs up to `parallel` choices of requests at once, each on a session of its own (a slot: a
// target shared from `target`, and a drafter opened from `drafter_spec` on it), all stepped
// together by one thread with specinfer_session_step_many: one pass over the weights per step for
// every running choice, drafts included (continuous batching). A request arriving takes a free
// slot per choice at the next step (in arrival order: a request waits until it has them all);
// its first choice scores the prompt `prefill_chunk` tokens per step, and the others take the
// scored prompt from it once it has emitted its first tokens. At most `max_queue` requests wait
// for slots.
class Worker : public Engine {
 public:
  struct Options {
    std::string drafter_spec;  // "" = plain decoding
    specinfer_session_params defaults{};
    int32_t max_queue = 16;
    int32_t parallel = 4;
    int32_t prefill_chunk = 64;
  };
  // Opens the slots' targets and drafters; nullptr with *error set when one cannot be opened.
  static std::unique_ptr<Worker> create(specinfer_registry *reg, specinfer_target *target,
                                        const Options &options, std::string *error);
  ~Worker() override;
  SubmitStatus submit(std::vector<GenJob> jobs,
                      std::shared_ptr<std::atomic<bool>> cancelled) override;
  EngineMetrics metrics() const override;
  void stop() override;
  bool tokenize(const std::string &text, bool add_special, std::vector<int32_t> *ids,
                std::string *error) override;
  bool detokenize(const std::vector<int32_t> &ids, std::string *text, std::string *error) override;

 private:
  struct Job {
    GenParams params;
    GenCallbacks callbacks;
    std::shared_ptr<std::atomic<bool>> cancelled;
    int32_t prompt_tokens = 0;        // counted by choice 0 when it starts
    std::vector<int32_t> prompt_ids;  // the prompt's tokens, when admit could have them
  };
  struct Slot {
    specinfer_target *target = nullptr;
    specinfer_drafter *drafter = nullptr;
    specinfer_session *session = nullptr;        // a choice is running
    specinfer_constraint *constraint = nullptr;  // its constraint (a fork of a compiled one)
    std::shared_ptr<Job> job;                    // the request, shared by its choices (null: free)
    int32_t choice = 0;
    // A choice waiting for the prompt: the slot of choice 0, which scores it (no session yet).
    Slot *source = nullptr;
    GenResult result;
    std::vector<int32_t> room;  // step_many's token buffer
    bool prompt_logprobs_sent = false;
    // The text of the slot's last session: its target's cache holds it (all but its last token)
    // for the next session on the slot.
    std::vector<int32_t> text;
    uint64_t last_used = 0;  // when a request last took it (Worker::uses_)
  };
  Worker(specinfer_registry *reg, specinfer_target *target, const Options &options);
  // Steps the running slots' sessions together until stopped: takes arrivals, steps, delivers.
  void loop();
  // Waits for work (a request queued, a slot running, or stopping) and takes the queued requests
  // that fit the free slots, in arrival order; *stopping set when the worker is to stop.
  std::vector<std::shared_ptr<Job>> take_arrivals(bool *stopping);
  // The slots with a session to step; those cancelled (all of them when stopping) end here.
  std::vector<Slot *> running_slots(bool stopping);
  // One step of the slots' sessions together (specinfer_session_step_many), counted in metrics_.
  void step_slots(const std::vector<Slot *> &active, const specinfer_step_params &step,
                  std::vector<specinfer_step_result> &results);
  // A step's result to the slot's request: its text and logprobs, or its end (stop, length,
  // failure).
  void deliver(Slot &slot, const specinfer_step_result &result);
  // Takes waiting requests into free slots, a slot per choice, and starts their first choices.
  void admit(std::vector<std::shared_ptr<Job>> arrived);
  // Starts the slot's choice: a session with its prompt fed (choice 0) or taken from `source`'s
  // session (the others); false with the slot's result set when it is refused.
  bool start(Slot &slot, Slot *source);
  // The slot's session with the request's settings; false with the slot's result set.
  bool open_session(Slot &slot);
  // Ends the slot's choice: its session's counts into the metrics, then on_done.
  void finish(Slot &slot);
  // Ends the choices still waiting for `source`'s prompt: started from it when it has scored it
  // (`scored`), else ended with its result.
  void start_waiting(Slot &source, bool scored);
  // A new constraint for a request's kind and grammar, forked from the compiled one kept for
  // them (compiled on first use; the kMaxCompiled most recently used are kept); nullptr with
  // *error set when the grammar does not compile or the plugin is missing.
  specinfer_constraint *open_constraint(const std::string &kind, const std::string &grammar,
                                        std::string *error);
  // The log-probabilities of the slot's last round (GenParams::logprobs).
  std::vector<TokenLogprob> round_logprobs(const Slot &slot) const;
  // Choice 0's prompt logprobs (GenParams::prompt_logprobs), once its prompt is scored.
  std::vector<TokenLogprob> prompt_logprobs(const Slot &slot) const;
  // Adds a step's rounds (specinfer_session_round_info of the slots that ran one) to metrics_.
  void count_step(const std::vector<specinfer_session *> &sessions,
                  const std::vector<specinfer_step_result> &results,
                  std::chrono::steady_clock::duration took);

  specinfer_registry *reg_;
  // The target the slots' targets are shared from, running no session: the tokenizer's for the
  // HTTP threads and the constraints' vocabulary, one caller at a time (target_mutex_).
  specinfer_target *target_;
  std::mutex target_mutex_;
  // Compiled constraints in their start state, most recently used last: (kind, grammar) -> it.
  struct Compiled {
    std::string kind, grammar;
    specinfer_constraint *constraint = nullptr;
  };
  static constexpr size_t kMaxCompiled = 8;
  std::vector<Compiled> compiled_;
  // The coupler of sampled requests: Gumbel-max, drafter-invariant, so the text a seed gives does
  // not depend on the drafts, which vary with the drafter's counts of earlier requests and with
  // the batch. Greedy requests use the session's default (greedy). A pure function: one serves
  // every slot.
  specinfer_coupler *sampled_coupler_ = nullptr;
  Options options_;
  specinfer_model_info info_;
  std::vector<Slot> slots_;
  uint64_t uses_ = 0;  // slots taken so far (Slot::last_used)

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  EngineMetrics metrics_;
  std::thread thread_;
};

}  // namespace serve
