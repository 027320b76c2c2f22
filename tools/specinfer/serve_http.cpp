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

#include "serve_request.h"
#include "serve_tools.h"

namespace serve {

using nlohmann::json;

namespace {

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

// What a running request shares between the engine's thread (the callbacks) and the HTTP thread.
struct Exchange {
  std::mutex m;
  std::condition_variable cv;
  bool started = false, done = false;
  int32_t prompt_tokens = 0;
  GenResult result;
  std::string pending;                         // text not yet sent (streaming) or the whole text
  std::vector<TokenLogprob> pending_logprobs;  // the same for the tokens' log-probabilities
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
  cb.on_text = [x](const std::string &piece, int32_t, std::vector<TokenLogprob> logprobs) {
    std::lock_guard<std::mutex> lock(x->m);
    x->pending += piece;
    for (TokenLogprob &t : logprobs) x->pending_logprobs.push_back(std::move(t));
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
      if (!r.param.empty()) {  // a field other than the prompt: a grammar that does not compile
        e.code = "invalid_value";
        e.param = r.param;
        break;
      }
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

// The prompt of a chat request: `messages` rendered with the model's chat template, into
// params->prompt; the error to answer with when the model has no template or rendering fails.
std::optional<ApiError> render_chat(const ModelEntry &m, const json &messages,
                                    const nlohmann::ordered_json &tools, GenParams *params) {
  if (m.chat.source.empty()) {
    ApiError e;
    e.message = m.chat_unavailable;
    e.code = "chat_unavailable";
    return e;
  }
  std::string error;
  std::string rendered;
  if (!m.chat.render(messages, tools, &rendered, &error)) return bad_param("messages", error);
  params->prompt = m.chat.prompt_of(std::move(rendered));
  return std::nullopt;
}

// The error for a request the engine of `m` did not queue.
ApiError not_queued(SubmitStatus st, const ModelEntry &m) {
  ApiError e;
  if (st == SubmitStatus::kQueueFull) {
    e.status = 429;
    e.type = "rate_limit_error";
    e.code = "queue_full";
    e.message = "the server is busy: " + std::to_string(m.max_queue) + " requests for " + m.name +
                " are waiting already; try again later";
  } else {
    e.status = 503;
    e.type = "server_error";
    e.message = "the server is stopping";
  }
  return e;
}

json usage_of(const GenResult &r) {
  return json{{"prompt_tokens", r.prompt_tokens},
              {"completion_tokens", r.completion_tokens},
              {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

json byte_list(const std::string &s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(c);
  return out;
}

// What every response object of one request carries, and the objects made from it.
struct Reply {
  bool chat = false;
  bool logprobs = false;  // the request asked for log-probabilities
  bool tools = false;     // the answer's tool calls are parsed out of its text
  std::string id;
  std::time_t created = 0;
  std::string model;

  // A choice's `logprobs`: null when not asked for; a chat's {"content": [{token, logprob, bytes,
  // top_logprobs}]}; a completion's {tokens, token_logprobs, top_logprobs, text_offset}, offsets
  // counted in bytes from `offset`, the completion's bytes before these tokens.
  json logprobs_of(const std::vector<TokenLogprob> &lp, size_t offset) const {
    if (!logprobs) return nullptr;
    if (chat) {
      json content = json::array();
      for (const TokenLogprob &t : lp) {
        json top = json::array();
        for (const auto &[bytes, v] : t.top)
          top.push_back({{"token", bytes}, {"logprob", v}, {"bytes", byte_list(bytes)}});
        content.push_back({{"token", t.bytes},
                           {"logprob", t.logprob},
                           {"bytes", byte_list(t.bytes)},
                           {"top_logprobs", top}});
      }
      return {{"content", content}, {"refusal", nullptr}};
    }
    json tokens = json::array(), values = json::array(), tops = json::array(),
         offsets = json::array();
    for (const TokenLogprob &t : lp) {
      tokens.push_back(t.bytes);
      values.push_back(t.logprob);
      json top = json::object();
      for (const auto &[bytes, v] : t.top)
        if (!top.contains(bytes)) top[bytes] = v;
      tops.push_back(top);
      offsets.push_back(offset);
      offset += t.bytes.size();
    }
    return {{"tokens", tokens},
            {"token_logprobs", values},
            {"top_logprobs", tops},
            {"text_offset", offsets}};
  }

  // A chat answer's text with its tool calls parsed out (when the request has tools).
  ParsedAnswer parsed(const std::string &text) const {
    if (!tools) return ParsedAnswer{text, json::array()};
    return parse_tool_calls(text, "call_" + id.substr(id.find('-') + 1) + "_");
  }

  // The whole answer (not streamed).
  json answer(const GenResult &result, const std::string &text,
              const std::vector<TokenLogprob> &lp) const {
    json choice = {
        {"index", 0}, {"finish_reason", result.finish_reason}, {"logprobs", logprobs_of(lp, 0)}};
    if (chat) {
      const ParsedAnswer a = parsed(text);
      choice["message"] = {{"role", "assistant"}, {"content", a.content}};
      if (!a.tool_calls.empty()) {
        if (a.content.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = a.tool_calls;
        choice["finish_reason"] = "tool_calls";
      }
    } else {
      choice["text"] = text;
    }
    return json{{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})},
                {"usage", usage_of(result)}};
  }

  // One streamed event's object (`lp`: its choice's logprobs).
  json chunk(const json &delta_or_text, const json &finish, json lp = nullptr) const {
    json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", std::move(lp)}};
    if (chat)
      choice["delta"] = delta_or_text;
    else
      choice["text"] = delta_or_text;
    return json{{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})}};
  }
};

// Answers with the whole text at once: now if the generation is done, else written (chunked) once
// the text is complete, and meanwhile the provider checks every 200 ms that the client is still
// there, so that a client gone away cancels its request. The status is 200 by then: a generation
// that fails later (a plugin error, the server stopping) answers with an error body.
void answer_whole(httplib::Response &res, const std::shared_ptr<Exchange> &x, const Reply &reply) {
  {
    std::lock_guard<std::mutex> lock(x->m);
    if (x->done) {
      if (x->result.kind != GenResult::Kind::kOk) return send_error(res, error_of(x->result));
      return send_json(res, 200, reply.answer(x->result, x->pending, x->pending_logprobs));
    }
  }
  res.set_chunked_content_provider(
      "application/json",
      [x, reply](size_t, httplib::DataSink &sink) {
        std::unique_lock<std::mutex> lock(x->m);
        x->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return x->done; });
        if (!x->done) {
          lock.unlock();
          if (sink.is_writable()) return true;
          x->cancelled->store(true);
          return false;
        }
        const json body = x->result.kind == GenResult::Kind::kOk
                              ? reply.answer(x->result, x->pending, x->pending_logprobs)
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
}

bool write_event(httplib::DataSink &sink, const json &j) {
  const std::string event = "data: " + dump(j) + "\n\n";
  return sink.write(event.data(), event.size());
}

// The events after the text of a finished generation: the finish_reason (and usage), or the
// error, then [DONE]; false when the client is gone.
bool write_end(httplib::DataSink &sink, const Reply &reply, const GenResult &result,
               bool include_usage) {
  bool ok = true;
  if (result.kind == GenResult::Kind::kOk) {
    ok = write_event(sink,
                     reply.chunk(reply.chat ? json::object() : json(""), result.finish_reason));
    if (ok && include_usage) {
      json u = reply.chunk(nullptr, nullptr);
      u["choices"] = json::array();
      u["usage"] = usage_of(result);
      ok = write_event(sink, u);
    }
  } else {
    ok = write_event(sink, error_body(error_of(result)));
  }
  static const char kDone[] = "data: [DONE]\n\n";
  if (ok) ok = sink.write(kDone, sizeof kDone - 1);
  if (ok) sink.done();
  return ok;
}

// Streaming: one SSE event per round with text, a last one with finish_reason, then [DONE].
void answer_stream(httplib::Response &res, const std::shared_ptr<Exchange> &x, const Reply &reply,
                   bool include_usage) {
  auto first = std::make_shared<bool>(true);
  auto sent = std::make_shared<size_t>(0);  // bytes of the tokens whose logprobs went out
  // With tools the answer is held until it is complete (its tool calls parsed out of it).
  auto held = std::make_shared<std::string>();
  auto held_logprobs = std::make_shared<std::vector<TokenLogprob>>();
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [x, reply, first, sent, held, held_logprobs, include_usage](size_t, httplib::DataSink &sink) {
        std::unique_lock<std::mutex> lock(x->m);
        x->cv.wait_for(lock, std::chrono::milliseconds(200), [&] {
          return !x->pending.empty() || !x->pending_logprobs.empty() || x->done;
        });
        std::string text;
        text.swap(x->pending);
        std::vector<TokenLogprob> lp;
        lp.swap(x->pending_logprobs);
        const bool done = x->done;
        GenResult result = x->result;
        lock.unlock();
        json tool_calls = json::array();
        if (reply.tools) {
          *held += text;
          for (TokenLogprob &t : lp) held_logprobs->push_back(std::move(t));
          text.clear();
          lp.clear();
          if (done && result.kind == GenResult::Kind::kOk) {
            ParsedAnswer a = reply.parsed(*held);
            text = std::move(a.content);
            lp.swap(*held_logprobs);
            for (size_t i = 0; i < a.tool_calls.size(); ++i) {
              json call = a.tool_calls[i];
              call["index"] = i;
              tool_calls.push_back(std::move(call));
            }
            if (!tool_calls.empty()) result.finish_reason = "tool_calls";
          }
        }
        // A client that has gone away cancels its request; the engine ends it at the next round.
        if (!sink.is_writable()) {
          x->cancelled->store(true);
          return false;
        }
        bool ok = true;
        if (reply.chat && *first)
          ok = write_event(sink, reply.chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
        *first = false;
        // Tokens without text yet (part of a character, text held back for a stop string) send
        // their logprobs with empty text.
        if (ok && (!text.empty() || (reply.logprobs && !lp.empty()))) {
          json logprobs = reply.logprobs_of(lp, *sent);
          for (const TokenLogprob &t : lp) *sent += t.bytes.size();
          ok = write_event(sink, reply.chunk(reply.chat ? json{{"content", text}} : json(text),
                                             nullptr, std::move(logprobs)));
        }
        if (ok && !tool_calls.empty())
          ok = write_event(sink, reply.chunk({{"tool_calls", tool_calls}}, nullptr));
        if (ok && done) ok = write_end(sink, reply, result, include_usage);
        if (!ok) x->cancelled->store(true);
        return ok;
      },
      [x](bool success) {
        if (!success) x->cancelled->store(true);
      });
}

}  // namespace

class Routes {
 public:
  explicit Routes(const ServerConfig &cfg) : cfg_(cfg), started_(std::time(nullptr)) {
    for (const ModelEntry &m : cfg_.models) names_.push_back(m.name);
    defaults_.max_tokens = cfg_.max_tokens;
    defaults_.temperature = cfg_.temperature;
    defaults_.top_p = cfg_.top_p;
    defaults_.seed = cfg_.seed;
  }

  void install(httplib::Server &srv);

 private:
  void completion(const httplib::Request &req, httplib::Response &res, bool chat);
  std::string metrics_text();
  void count(const httplib::Request &req, const httplib::Response &res);
  json model_object(const ModelEntry &m) const;

  ServerConfig cfg_;
  std::vector<std::string> names_;  // the served models' names, in cfg_.models' order
  RequestDefaults defaults_;
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
    size_t m = 0;
    if (auto e = pick_model({{"model", req.matches[1].str()}}, names_, &m))
      return send_error(res, *e);
    send_json(res, 200, model_object(cfg_.models[m]));
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

void Routes::completion(const httplib::Request &req, httplib::Response &res, bool chat) {
  CompletionRequest r;
  if (auto e = parse_completion_request(req.body, chat, names_, defaults_, &r))
    return send_error(res, *e);
  const ModelEntry &model_entry = cfg_.models[r.model];
  GenParams params = std::move(r.params);
  const bool tools = chat && r.tool_choice != "none";
  if (tools && !template_has_tool_calls(model_entry.chat.source))
    return send_error(res, bad_param("tools", "the chat template of " + model_entry.name +
                                                  " has no tool-call format this server reads "
                                                  "(<tool_call> blocks)"));
  if (chat)
    if (auto e = render_chat(model_entry, messages_for_template(r.messages),
                             tools ? r.tools : nlohmann::ordered_json(nullptr), &params))
      return send_error(res, *e);
  if (r.tool_choice == "required" || r.tool_choice == "function") {
    params.constraint_kind = "lark";
    params.constraint = tool_call_grammar(r.tools, r.tool_function);
    params.constraint_param = "tools";
  }

  params.stop = std::move(r.stop);
  auto x = std::make_shared<Exchange>();
  const SubmitStatus st = model_entry.engine->submit(params, callbacks_for(x), x->cancelled);
  if (st != SubmitStatus::kQueued) return send_error(res, not_queued(st, model_entry));
  {
    std::unique_lock<std::mutex> lock(x->m);
    x->cv.wait(lock, [&] { return x->started || x->done; });
    if (x->done && x->result.kind != GenResult::Kind::kOk)
      return send_error(res, error_of(x->result));
  }

  Reply reply;
  reply.chat = chat;
  reply.id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  reply.created = std::time(nullptr);
  reply.model = model_entry.name;
  reply.logprobs = params.logprobs >= 0;
  reply.tools = tools;
  if (r.stream)
    answer_stream(res, x, reply, r.include_usage);
  else
    answer_whole(res, x, reply);
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
  // The batched steps: what the draft budget allowed and what it cost.
  metric("specinfer_steps_total", "counter",
         "Batched steps (one target pass for every running request) that ran rounds.",
         [](const EngineMetrics &m) { return m.step.steps; });
  metric("specinfer_step_rounds_total", "counter", "Requests' rounds in those steps.",
         [](const EngineMetrics &m) { return m.step.rounds; });
  metric("specinfer_step_draft_budget_tokens_total", "counter",
         "Tokens the draft budget let those rounds draft.",
         [](const EngineMetrics &m) { return m.step.budget; });
  metric("specinfer_step_drafted_tokens_total", "counter", "Tokens those rounds drafted.",
         [](const EngineMetrics &m) { return m.step.drafted; });
  metric("specinfer_step_tokens_total", "counter", "Tokens those steps emitted.",
         [](const EngineMetrics &m) { return m.step.tokens; });
  metric("specinfer_step_seconds_total", "counter",
         "Wall time of those steps (drafting, the pass, coupling).",
         [](const EngineMetrics &m) { return m.step_seconds; });
  metric("specinfer_step_pass_seconds_total", "counter", "Time of their target passes.",
         [](const EngineMetrics &m) { return m.step.pass_ms / 1000.0; });
  metric("specinfer_step_predicted_pass_seconds_total", "counter",
         "Time the measured pass costs predicted for those passes before they ran.",
         [](const EngineMetrics &m) { return m.step.predicted_pass_ms / 1000.0; });
  metric("specinfer_goodput_tokens_per_second", "gauge",
         "Tokens the steps emitted over their wall time, since the start.",
         [](const EngineMetrics &m) {
           return m.step_seconds > 0 ? double(m.step.tokens) / m.step_seconds : 0.0;
         });
  head("specinfer_planned_goodput_tokens_per_second", "gauge",
       "The last step's plan (several requests): expected tokens/s of the drafts the budget rule "
       "chose, and of the same step without drafts.");
  series("specinfer_planned_goodput_tokens_per_second", "plan=\"chosen\"",
         [](const EngineMetrics &m) { return m.step.goodput; });
  series("specinfer_planned_goodput_tokens_per_second", "plan=\"plain\"",
         [](const EngineMetrics &m) { return m.step.plain_goodput; });
  return o.str();
}

void ConnectionPool::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(m_);
  jobs_.push_back(std::move(fn));
  // Every idle thread will take one waiting connection; more waiting than that get a new thread.
  if (jobs_.size() > idle_ && threads_.size() < max_) threads_.emplace_back([this] { work(); });
  cv_.notify_one();
}

void ConnectionPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread &t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void ConnectionPool::work() {
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    --idle_;
    if (jobs_.empty()) return;  // stopping, nothing left to run
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
}

std::shared_ptr<Routes> install_routes(httplib::Server &server, const ServerConfig &config) {
  auto routes = std::make_shared<Routes>(config);
  routes->install(server);
  return routes;
}

}  // namespace serve
