// OpenAI-compatible routes of `specinfer serve` (serve_http.h).
#include "serve_http.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace serve {

using nlohmann::json;

namespace {

constexpr int kMaxDepth = 64;  // most nesting of a request body

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};

json error_body(const ApiError &e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const json &j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_json(httplib::Response &res, int status, const json &body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response &res, const ApiError &e) {
  send_json(res, e.status, error_body(e));
}

ApiError bad_param(const std::string &param, const std::string &message) {
  ApiError e;
  e.message = message;
  e.param = param;
  e.code = "invalid_value";
  return e;
}

// The fields both completion endpoints take, checked.
struct Sampling {
  int32_t max_tokens = 0;
  float temperature = 0, top_p = 1;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

std::optional<ApiError> read_sampling(const json &body, const ServerConfig &cfg, bool chat,
                                      Sampling *s) {
  s->max_tokens = cfg.max_tokens;
  s->temperature = cfg.temperature;
  s->top_p = cfg.top_p;
  s->seed = cfg.seed;
  for (const char *key : {"max_tokens", "max_completion_tokens"}) {
    if (!chat && std::string(key) == "max_completion_tokens") continue;
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 24))
      return bad_param(key, std::string(key) + " must be an integer from 1 to 16777216");
    s->max_tokens = static_cast<int32_t>(it->get<int64_t>());
  }
  if (const auto it = body.find("temperature"); it != body.end() && !it->is_null()) {
    if (!it->is_number() || !(it->get<double>() >= 0 && it->get<double>() <= 2))
      return bad_param("temperature", "temperature must be a number from 0 to 2");
    s->temperature = it->get<float>();
  }
  if (const auto it = body.find("top_p"); it != body.end() && !it->is_null()) {
    if (!it->is_number() || !(it->get<double>() > 0 && it->get<double>() <= 1))
      return bad_param("top_p", "top_p must be a number greater than 0 and at most 1");
    s->top_p = it->get<float>();
  }
  if (const auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return bad_param("seed", "seed must be an integer");
    s->seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      s->stop.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= 16) {
      for (const json &x : *it) {
        if (!x.is_string()) return bad_param("stop", "stop must be a string or a list of strings");
        s->stop.push_back(x.get<std::string>());
      }
    } else {
      return bad_param("stop", "stop must be a string or a list of at most 16 strings");
    }
  }
  if (const auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad_param("stream", "stream must be true or false");
    s->stream = it->get<bool>();
  }
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad_param("stream_options", "stream_options must be an object");
    const auto u = it->find("include_usage");
    if (u != it->end() && !u->is_null()) {
      if (!u->is_boolean())
        return bad_param("stream_options", "stream_options.include_usage must be true or false");
      s->include_usage = u->get<bool>();
    }
  }
  // Features this server does not have: refused rather than silently ignored.
  for (const char *key : {"echo", "logprobs", "best_of", "suffix", "tools", "functions"}) {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    const bool off = (it->is_boolean() && !it->get<bool>()) ||
                     (it->is_number_integer() && it->get<int64_t>() == (key[0] == 'b' ? 1 : 0)) ||
                     (it->is_string() && it->get<std::string>().empty()) ||
                     (it->is_array() && it->empty());
    if (!off) return bad_param(key, std::string(key) + " is not supported by this server");
  }
  if (const auto it = body.find("n"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != 1)
      return bad_param("n", "only n = 1 is supported");
  }
  return std::nullopt;
}

// What a running request shares between the engine's thread (the callbacks) and the HTTP thread.
struct Exchange {
  std::mutex m;
  std::condition_variable cv;
  bool started = false, done = false;
  int32_t prompt_tokens = 0;
  GenResult result;
  std::string pending;  // text not yet sent (streaming) or the whole text
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
};

GenCallbacks callbacks_for(const std::shared_ptr<Exchange> &x) {
  GenCallbacks cb;
  cb.on_start = [x](int32_t prompt_tokens) {
    std::lock_guard<std::mutex> lock(x->m);
    x->started = true;
    x->prompt_tokens = prompt_tokens;
    x->cv.notify_all();
  };
  cb.on_text = [x](const std::string &piece, int32_t) {
    std::lock_guard<std::mutex> lock(x->m);
    x->pending += piece;
    x->cv.notify_all();
    return true;
  };
  cb.on_done = [x](const GenResult &r) {
    std::lock_guard<std::mutex> lock(x->m);
    x->result = r;
    x->done = true;
    x->cv.notify_all();
  };
  return cb;
}

ApiError error_of(const GenResult &r) {
  ApiError e;
  switch (r.kind) {
    case GenResult::Kind::kBadRequest:
      e.message = r.message;
      e.code = r.prompt_tokens > 0 ? "context_length_exceeded" : "invalid_prompt";
      e.param = r.prompt_tokens > 0 ? "messages" : "prompt";
      break;
    case GenResult::Kind::kCancelled:
      e.status = 503;
      e.type = "server_error";
      e.message = "the request was cancelled (the server is stopping)";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      e.message = "generation failed: " + r.message;
      break;
  }
  return e;
}

}  // namespace

class Routes {
 public:
  explicit Routes(const ServerConfig &cfg) : cfg_(cfg), started_(std::time(nullptr)) {}

  void install(httplib::Server &srv);

 private:
  void completion(const httplib::Request &req, httplib::Response &res, bool chat);
  std::string metrics_text();
  void count(const httplib::Request &req, const httplib::Response &res);
  json model_object(const ModelEntry &m) const;
  // The model a request's `model` field names; an error when it names none, or leaves it out
  // while several are served.
  std::optional<ApiError> pick_model(const json &body, const ModelEntry **out) const;
  std::string names() const;

  ServerConfig cfg_;
  std::time_t started_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex count_mutex_;
  std::map<std::pair<std::string, int>, int64_t> http_requests_;  // (path, status) -> count
};

void Routes::install(httplib::Server &srv) {
  srv.Get("/health", [](const httplib::Request &, httplib::Response &res) {
    send_json(res, 200, {{"status", "ok"}});
  });
  srv.Get("/v1/models", [this](const httplib::Request &, httplib::Response &res) {
    json data = json::array();
    for (const ModelEntry &m : cfg_.models) data.push_back(model_object(m));
    send_json(res, 200, {{"object", "list"}, {"data", data}});
  });
  srv.Get("/v1/models/(.+)", [this](const httplib::Request &req, httplib::Response &res) {
    const ModelEntry *m = nullptr;
    if (auto e = pick_model({{"model", req.matches[1].str()}}, &m)) return send_error(res, *e);
    send_json(res, 200, model_object(*m));
  });
  srv.Post("/v1/completions", [this](const httplib::Request &req, httplib::Response &res) {
    completion(req, res, false);
  });
  srv.Post("/v1/chat/completions", [this](const httplib::Request &req, httplib::Response &res) {
    completion(req, res, true);
  });
  srv.Get("/metrics", [this](const httplib::Request &, httplib::Response &res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  srv.set_error_handler([](const httplib::Request &req, httplib::Response &res) {
    if (!res.body.empty()) return;  // a handler's own error body
    ApiError e;
    e.status = res.status;
    if (res.status == 404) {
      e.message = "no route " + req.method + " " + req.path;
      e.code = "not_found";
    } else {
      e.message = "HTTP status " + std::to_string(res.status);
      if (res.status >= 500) e.type = "server_error";
    }
    send_error(res, e);
  });
  srv.set_exception_handler(
      [](const httplib::Request &, httplib::Response &res, std::exception_ptr ep) {
        ApiError e;
        e.status = 500;
        e.type = "server_error";
        e.message = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception &ex) {
          e.message = std::string("internal error: ") + ex.what();
        } catch (...) {
        }
        send_error(res, e);
      });
  srv.set_logger(
      [this](const httplib::Request &req, const httplib::Response &res) { count(req, res); });
}

void Routes::count(const httplib::Request &req, const httplib::Response &res) {
  static const char *const kKnown[] = {"/health", "/v1/models", "/v1/completions",
                                       "/v1/chat/completions", "/metrics"};
  std::string path = "other";
  for (const char *k : kKnown)
    if (req.path == k) path = k;
  if (path == "other" && req.path.rfind("/v1/models/", 0) == 0) path = "/v1/models/{model}";
  std::lock_guard<std::mutex> lock(count_mutex_);
  http_requests_[{path, res.status}]++;
}

json Routes::model_object(const ModelEntry &m) const {
  return {{"id", m.name}, {"object", "model"}, {"created", started_}, {"owned_by", "specinfer"}};
}

std::string Routes::names() const {
  std::string out;
  for (const ModelEntry &m : cfg_.models) out += (out.empty() ? "'" : ", '") + m.name + "'";
  return out;
}

std::optional<ApiError> Routes::pick_model(const json &body, const ModelEntry **out) const {
  const auto it = body.find("model");
  if (it == body.end() || it->is_null()) {
    if (cfg_.models.size() == 1) {
      *out = &cfg_.models[0];
      return std::nullopt;
    }
    ApiError e;
    e.message = "you must give a model: this server has " + names();
    e.param = "model";
    return e;
  }
  if (!it->is_string()) return bad_param("model", "model must be a string");
  for (const ModelEntry &m : cfg_.models)
    if (m.name == it->get<std::string>()) {
      *out = &m;
      return std::nullopt;
    }
  ApiError e;
  e.status = 404;
  e.message = "the model '" + it->get<std::string>() + "' does not exist; this server has " +
              (cfg_.models.size() == 1 ? "" : "the models ") + names();
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

void Routes::completion(const httplib::Request &req, httplib::Response &res, bool chat) {
  // Nesting deeper than kMaxDepth is refused while parsing (the parser itself does not recurse):
  // later steps (dump, the template engine) walk values recursively.
  bool too_deep = false;
  json body = json::parse(
      req.body,
      [&too_deep](int depth, json::parse_event_t, json &) {
        if (depth > kMaxDepth) too_deep = true;
        return !too_deep;
      },
      false);
  if (too_deep || body.is_discarded() || !body.is_object()) {
    ApiError e;
    e.message = too_deep              ? "the body is nested too deeply"
                : body.is_discarded() ? "the body is not valid JSON"
                                      : "the body must be a JSON object";
    e.code = "invalid_json";
    return send_error(res, e);
  }
  const ModelEntry *mp = nullptr;
  if (auto e = pick_model(body, &mp)) return send_error(res, *e);
  const ModelEntry &model_entry = *mp;
  Sampling s;
  if (auto e = read_sampling(body, cfg_, chat, &s)) return send_error(res, *e);

  GenParams params;
  params.max_tokens = s.max_tokens;
  params.temperature = s.temperature;
  params.top_p = s.top_p;
  params.seed = s.seed;
  if (chat) {
    const auto it = body.find("messages");
    if (it == body.end() || !it->is_array() || it->empty())
      return send_error(res, bad_param("messages", "messages must be a non-empty list"));
    json messages = json::array();
    for (const json &m : *it) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return send_error(res, bad_param("messages", "each message must be an object with a role"));
      json msg = m;
      const json content = m.value("content", json(nullptr));
      if (content.is_array()) {  // content parts: the text ones, joined
        std::string text;
        for (const json &part : content) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
              !part["text"].is_string())
            return send_error(res, bad_param("messages", "only text content parts are supported"));
          text += part["text"].get<std::string>();
        }
        msg["content"] = text;
      } else if (content.is_null()) {
        msg["content"] = "";
      } else if (!content.is_string()) {
        return send_error(res, bad_param("messages", "a message's content must be a string"));
      }
      messages.push_back(std::move(msg));
    }
    if (model_entry.chat.source.empty()) {
      ApiError e;
      e.message = model_entry.chat_unavailable;
      e.code = "chat_unavailable";
      return send_error(res, e);
    }
    std::string error;
    std::string rendered;
    if (!model_entry.chat.render(messages, &rendered, &error))
      return send_error(res, bad_param("messages", error));
    params.prompt = model_entry.chat.prompt_of(std::move(rendered));
  } else {
    const auto it = body.find("prompt");
    if (it != body.end() && it->is_string()) {
      params.prompt = it->get<std::string>();
    } else if (it != body.end() && it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
      params.prompt = (*it)[0].get<std::string>();
    } else {
      return send_error(res, bad_param("prompt", "prompt must be a string (or a list of one)"));
    }
    if (params.prompt.empty())
      return send_error(res, bad_param("prompt", "prompt must not be empty"));
  }

  params.stop = s.stop;
  auto x = std::make_shared<Exchange>();
  const SubmitStatus st = model_entry.engine->submit(params, callbacks_for(x), x->cancelled);
  if (st != SubmitStatus::kQueued) {
    ApiError e;
    if (st == SubmitStatus::kQueueFull) {
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "queue_full";
      e.message = "the server is busy: " + std::to_string(model_entry.max_queue) +
                  " requests for " + model_entry.name + " are waiting already; try again later";
    } else {
      e.status = 503;
      e.type = "server_error";
      e.message = "the server is stopping";
    }
    return send_error(res, e);
  }
  {
    std::unique_lock<std::mutex> lock(x->m);
    x->cv.wait(lock, [&] { return x->started || x->done; });
    if (x->done && x->result.kind != GenResult::Kind::kOk)
      return send_error(res, error_of(x->result));
  }

  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  const std::time_t created = std::time(nullptr);
  const std::string model = model_entry.name;
  const auto usage = [](const GenResult &r) {
    return json{{"prompt_tokens", r.prompt_tokens},
                {"completion_tokens", r.completion_tokens},
                {"total_tokens", r.prompt_tokens + r.completion_tokens}};
  };

  const auto answer = [=](const GenResult &result, const std::string &text) {
    json choice = {{"index", 0}, {"finish_reason", result.finish_reason}, {"logprobs", nullptr}};
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    else
      choice["text"] = text;
    return json{{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})},
                {"usage", usage(result)}};
  };
  if (!s.stream) {
    {
      std::lock_guard<std::mutex> lock(x->m);
      if (x->done) {
        if (x->result.kind != GenResult::Kind::kOk) return send_error(res, error_of(x->result));
        return send_json(res, 200, answer(x->result, x->pending));
      }
    }
    // Still generating: the answer is written (chunked) once the text is complete, and meanwhile
    // the provider checks every 200 ms that the client is still there, so that a client gone
    // away cancels its request. The status is 200 by then: a generation that fails later (a
    // plugin error, the server stopping) answers with an error body.
    res.set_chunked_content_provider(
        "application/json",
        [=](size_t, httplib::DataSink &sink) {
          std::unique_lock<std::mutex> lock(x->m);
          x->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return x->done; });
          if (!x->done) {
            lock.unlock();
            if (sink.is_writable()) return true;
            x->cancelled->store(true);
            return false;
          }
          const json body = x->result.kind == GenResult::Kind::kOk
                                ? answer(x->result, x->pending)
                                : error_body(error_of(x->result));
          lock.unlock();
          const std::string text = dump(body);
          if (!sink.write(text.data(), text.size())) {
            x->cancelled->store(true);
            return false;
          }
          sink.done();
          return true;
        },
        [x](bool success) {
          if (!success) x->cancelled->store(true);
        });
    return;
  }

  // Streaming: one SSE event per round with text, a last one with finish_reason, then [DONE].
  const auto chunk = [=](const json &delta_or_text, const json &finish) {
    json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
    if (chat)
      choice["delta"] = delta_or_text;
    else
      choice["text"] = delta_or_text;
    return json{{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})}};
  };
  const auto write_event = [](httplib::DataSink &sink, const json &j) {
    const std::string event = "data: " + dump(j) + "\n\n";
    return sink.write(event.data(), event.size());
  };
  auto first = std::make_shared<bool>(true);
  const bool include_usage = s.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink &sink) {
        std::unique_lock<std::mutex> lock(x->m);
        x->cv.wait_for(lock, std::chrono::milliseconds(200),
                       [&] { return !x->pending.empty() || x->done; });
        std::string text;
        text.swap(x->pending);
        const bool done = x->done;
        const GenResult result = x->result;
        lock.unlock();
        // A client that has gone away cancels its request; the engine ends it at the next round.
        if (!sink.is_writable()) {
          x->cancelled->store(true);
          return false;
        }
        bool ok = true;
        if (chat && *first)
          ok = write_event(sink, chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
        *first = false;
        if (ok && !text.empty())
          ok = write_event(sink, chunk(chat ? json{{"content", text}} : json(text), nullptr));
        if (ok && done) {
          if (result.kind == GenResult::Kind::kOk) {
            ok = write_event(sink, chunk(chat ? json::object() : json(""), result.finish_reason));
            if (ok && include_usage) {
              json u = chunk(nullptr, nullptr);
              u["choices"] = json::array();
              u["usage"] = usage(result);
              ok = write_event(sink, u);
            }
          } else {
            ok = write_event(sink, error_body(error_of(result)));
          }
          static const char kDone[] = "data: [DONE]\n\n";
          if (ok) ok = sink.write(kDone, sizeof kDone - 1);
          if (ok) sink.done();
        }
        if (!ok) x->cancelled->store(true);
        return ok;
      },
      [x](bool success) {
        if (!success) x->cancelled->store(true);
      });
}

std::string Routes::metrics_text() {
  std::vector<EngineMetrics> ms;
  for (const ModelEntry &m : cfg_.models) ms.push_back(m.engine->metrics());
  std::ostringstream o;
  const auto head = [&](const char *name, const char *type, const char *help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  // One series per model: name{model="..."[,extra]} value.
  const auto series = [&](const char *name, const std::string &extra, auto value_of) {
    for (size_t i = 0; i < ms.size(); ++i)
      o << name << "{model=\"" << cfg_.models[i].name << '"' << (extra.empty() ? "" : ",") << extra
        << "} " << value_of(ms[i]) << '\n';
  };
  const auto metric = [&](const char *name, const char *type, const char *help, auto value_of) {
    head(name, type, help);
    series(name, "", value_of);
  };
  head("specinfer_http_requests_total", "counter", "HTTP requests answered, by path and status.");
  {
    std::lock_guard<std::mutex> lock(count_mutex_);
    for (const auto &[key, n] : http_requests_)
      o << "specinfer_http_requests_total{path=\"" << key.first << "\",status=\"" << key.second
        << "\"} " << n << '\n';
  }
  head("specinfer_requests_total", "counter", "Generation requests by model and outcome.");
  series("specinfer_requests_total", "outcome=\"done\"",
         [](const EngineMetrics &m) { return m.requests_done; });
  series("specinfer_requests_total", "outcome=\"failed\"",
         [](const EngineMetrics &m) { return m.requests_failed; });
  series("specinfer_requests_total", "outcome=\"cancelled\"",
         [](const EngineMetrics &m) { return m.requests_cancelled; });
  series("specinfer_requests_total", "outcome=\"rejected\"",
         [](const EngineMetrics &m) { return m.requests_rejected; });
  metric("specinfer_prompt_tokens_total", "counter", "Prompt tokens scored.",
         [](const EngineMetrics &m) { return m.prompt_tokens; });
  metric("specinfer_generated_tokens_total", "counter", "Tokens generated.",
         [](const EngineMetrics &m) { return m.generated_tokens; });
  metric("specinfer_drafted_tokens_total", "counter", "Tokens the drafter proposed.",
         [](const EngineMetrics &m) { return m.drafted; });
  metric("specinfer_accepted_tokens_total", "counter", "Drafted tokens the target kept.",
         [](const EngineMetrics &m) { return m.accepted; });
  metric("specinfer_acceptance_rate", "gauge", "Accepted over drafted tokens since the start.",
         [](const EngineMetrics &m) {
           return m.drafted ? double(m.accepted) / double(m.drafted) : 0.0;
         });
  metric("specinfer_queue_depth", "gauge", "Requests waiting for the engine.",
         [](const EngineMetrics &m) { return m.queue_depth; });
  metric("specinfer_requests_running", "gauge", "Requests generating now.",
         [](const EngineMetrics &m) { return m.running; });
  head("specinfer_round_seconds", "summary",
       "Speculate-verify rounds and their time (prompt excluded).");
  series("specinfer_round_seconds_sum", "", [](const EngineMetrics &m) { return m.round_seconds; });
  series("specinfer_round_seconds_count", "", [](const EngineMetrics &m) { return m.rounds; });
  metric("specinfer_prefill_seconds_total", "counter", "Time scoring prompts.",
         [](const EngineMetrics &m) { return m.prefill_seconds; });
  return o.str();
}

std::shared_ptr<Routes> install_routes(httplib::Server &server, const ServerConfig &config) {
  auto routes = std::make_shared<Routes>(config);
  routes->install(server);
  return routes;
}

}  // namespace serve
