// The HTTP side of `specinfer serve`: OpenAI-compatible routes on a cpp-httplib server, each
// request validated, rendered to a prompt and handed to the Engine (serve_engine.h).
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve_chat.h"
#include "serve_engine.h"

namespace serve {

// One served model: its name in the API, the engine that runs its requests, its chat template.
struct ModelEntry {
  std::string name;  // what /v1/models lists and a request's `model` picks
  Engine *engine = nullptr;
  int32_t n_ctx = 0;
  int32_t max_queue = 0;
  int32_t parallel = 1;  // choices its engine runs at once (the most `n` a request may ask for)
  // The chat template; when `chat.source` is empty, /v1/chat/completions answers 400 with
  // `chat_unavailable`.
  ChatTemplate chat;
  std::string chat_unavailable;
};

struct ServerConfig {
  // The served models. A request names one in `model` (an unknown name gets 404
  // model_not_found); with one model, a request may leave `model` out.
  std::vector<ModelEntry> models;
  // Defaults for fields a request leaves out.
  int32_t max_tokens = 128;
  float temperature = 0, top_p = 1;
  uint64_t seed = 0;
};

// httplib's task queue for the server: a thread per open connection, kept for the next one when
// its connection closes, up to `max_threads` (then connections wait for a thread). A connection
// holds its thread while it is open, sending nothing included (until httplib's read timeout):
// with a fixed pool, a few hundred idle or half-open connections would hold up every request
// behind them.
class ConnectionPool : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t max_threads) : max_(max_threads) {}
  ~ConnectionPool() override { shutdown(); }
  void enqueue(std::function<void()> fn) override;
  // Runs the connections still waiting, then joins every thread.
  void shutdown() override;

 private:
  void work();

  size_t max_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;  // threads waiting for a connection
  bool stopping_ = false;
};

// Installs /health, /v1/models, /v1/models/{model}, /v1/completions, /v1/chat/completions and
// /metrics on `server`, plus OpenAI-style error bodies for unknown paths and failed handlers. The
// engines and the returned state must outlive the server's use of them.
class Routes;
std::shared_ptr<Routes> install_routes(httplib::Server &server, const ServerConfig &config);

}  // namespace serve
