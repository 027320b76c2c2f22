// The HTTP side of `specinfer serve`: OpenAI-compatible routes on a cpp-httplib server, each
// request validated, rendered to a prompt and handed to the Engine (serve_engine.h).
#pragma once

#include <httplib.h>

#include <cstdint>
#include <memory>
#include <string>
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

// Installs /health, /v1/models, /v1/models/{model}, /v1/completions, /v1/chat/completions and
// /metrics on `server`, plus OpenAI-style error bodies for unknown paths and failed handlers. The
// engines and the returned state must outlive the server's use of them.
class Routes;
std::shared_ptr<Routes> install_routes(httplib::Server &server, const ServerConfig &config);

}  // namespace serve
