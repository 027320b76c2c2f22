// OpenAI-compatible routes of `specinfer serve` (serve_http.h).
#include "serve_http.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
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
// A request of several prompts has per_prompt choices for each, prompt p's at p * per_prompt on.
struct Exchange {
  Exchange(size_t n_prompts, int32_t n)
      : choices(n_prompts * static_cast<size_t>(n)),
        per_prompt(static_cast<size_t>(n)),
        prompt_texts(n_prompts) {}
  std::mutex m;
  std::condition_variable cv;
  struct Choice {
    std::string pending;                         // text not yet sent (streaming) or the whole text
    std::vector<TokenLogprob> pending_logprobs;  // the same for the tokens' log-probabilities
    GenResult result;
    bool done = false;
  };
  std::vector<Choice> choices;
  size_t per_prompt;
  std::vector<std::string> prompt_texts;  // each prompt (token ids decoded), for echo
  size_t n_started = 0;                   // prompts the engine has accepted
  size_t n_done = 0;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);

  bool done() const { return n_done == choices.size(); }
  bool started() const { return n_started == prompt_texts.size(); }
  // The request's error (nullptr: none): the first choice that failed, else the first that was
  // cancelled (the others end cancelled once one fails).
  const GenResult *failure() const {
    const GenResult *cancelled_choice = nullptr;
    for (const Choice &c : choices) {
      if (!c.done || c.result.kind == GenResult::Kind::kOk) continue;
      if (c.result.kind != GenResult::Kind::kCancelled) return &c.result;
      if (!cancelled_choice) cancelled_choice = &c.result;
    }
    return cancelled_choice;
  }
  // The request's token counts: each prompt once, every choice's completion.
  GenResult usage() const {
    GenResult u;
    for (size_t p = 0; p < prompt_texts.size(); ++p) {
      int32_t prompt = 0;
      for (size_t i = p * per_prompt; i < (p + 1) * per_prompt; ++i) {
        prompt = std::max(prompt, choices[i].result.prompt_tokens);
        u.completion_tokens += choices[i].result.completion_tokens;
      }
      u.prompt_tokens += prompt;
      u.cached_tokens += choices[p * per_prompt].result.cached_tokens;  // choice 0 scored it
    }
    return u;
  }
};

// The callbacks of prompt p's job: its choice i is the request's p * per_prompt + i.
GenCallbacks callbacks_for(const std::shared_ptr<Exchange> &x, size_t p) {
  GenCallbacks cb;
  const size_t first = p * x->per_prompt;
  cb.on_start = [x, p](int32_t, const std::string &prompt_text) {
    std::lock_guard<std::mutex> lock(x->m);
    x->prompt_texts[p] = prompt_text;
    x->n_started++;
    x->cv.notify_all();
  };
  cb.on_text = [x, first](int32_t i, const std::string &piece, int32_t,
                          std::vector<TokenLogprob> logprobs) {
    std::lock_guard<std::mutex> lock(x->m);
    Exchange::Choice &c = x->choices[first + static_cast<size_t>(i)];
    c.pending += piece;
    for (TokenLogprob &t : logprobs) c.pending_logprobs.push_back(std::move(t));
    x->cv.notify_all();
    return true;
  };
  // The prompt's entries go before every choice's own of this prompt (none has any yet: choice 0
  // is about to give its first, the others start after it).
  cb.on_prompt_logprobs = [x, first](std::vector<TokenLogprob> prompt) {
    std::lock_guard<std::mutex> lock(x->m);
    for (size_t i = first; i < first + x->per_prompt; ++i) {
      std::vector<TokenLogprob> &lp = x->choices[i].pending_logprobs;
      lp.insert(lp.begin(), prompt.begin(), prompt.end());
    }
    x->cv.notify_all();
  };
  cb.on_done = [x, first](int32_t i, const GenResult &r) {
    std::lock_guard<std::mutex> lock(x->m);
    Exchange::Choice &c = x->choices[first + static_cast<size_t>(i)];
    c.result = r;
    c.done = true;
    x->n_done++;
    // The answer is this error now: the other choices are not wanted any more.
    if (r.kind != GenResult::Kind::kOk) x->cancelled->store(true);
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
  if (st == SubmitStatus::kTooManyChoices) {
    e = bad_param("n", "n is more than the " + std::to_string(m.parallel) +
                           " requests this server runs at once for " + m.name + " (--parallel)");
  } else if (st == SubmitStatus::kQueueFull) {
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
              {"total_tokens", r.prompt_tokens + r.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

json byte_list(const std::string &s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(c);
  return out;
}

// What every response object of one request carries, and the objects made from it.
struct Reply {
  bool chat = false;
  // echo: each prompt, put before the text of its choices (per_prompt each); none: empty.
  std::vector<std::string> echo;
  size_t per_prompt = 1;
  bool logprobs = false;  // the request asked for log-probabilities
  // echo with logprobs: a choice's entries start with the prompt's tokens, at text offset 0.
  bool prompt_logprobs = false;
  bool tools = false;  // the answer's tool calls are parsed out of its text
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
      // A prompt's first token has no log-probability: null, as OpenAI gives it.
      const bool none = std::isnan(t.logprob);
      values.push_back(none ? json(nullptr) : json(t.logprob));
      json top = json::object();
      for (const auto &[bytes, v] : t.top)
        if (!top.contains(bytes)) top[bytes] = v;
      tops.push_back(none ? json(nullptr) : top);
      offsets.push_back(offset);
      offset += t.bytes.size();
    }
    return {{"tokens", tokens},
            {"token_logprobs", values},
            {"top_logprobs", tops},
            {"text_offset", offsets}};
  }

  const std::string &echo_of(size_t choice) const {
    static const std::string kNone;
    return echo.empty() ? kNone : echo[choice / per_prompt];
  }
  // The text offset of a choice's first entry: 0 when they start with the prompt's.
  size_t offset_of(size_t choice) const { return prompt_logprobs ? 0 : echo_of(choice).size(); }

  // A chat answer's text with its tool calls parsed out (when the request has tools).
  ParsedAnswer parsed(const std::string &text) const {
    if (!tools) return ParsedAnswer{text, json::array()};
    return parse_tool_calls(text, "call_" + id.substr(id.find('-') + 1) + "_");
  }

  // The whole answer (not streamed), every choice done.
  json answer(const Exchange &x) const {
    json choices = json::array();
    for (size_t i = 0; i < x.choices.size(); ++i) {
      const Exchange::Choice &c = x.choices[i];
      json choice = {{"index", i},
                     {"finish_reason", c.result.finish_reason},
                     {"logprobs", logprobs_of(c.pending_logprobs, offset_of(i))}};
      if (chat) {
        const ParsedAnswer a = parsed(c.pending);
        choice["message"] = {{"role", "assistant"}, {"content", a.content}};
        if (!a.tool_calls.empty()) {
          if (a.content.empty()) choice["message"]["content"] = nullptr;
          choice["message"]["tool_calls"] = a.tool_calls;
          choice["finish_reason"] = "tool_calls";
        }
      } else {
        choice["text"] = echo_of(i) + c.pending;
      }
      choices.push_back(std::move(choice));
    }
    return json{{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", std::move(choices)},
                {"usage", usage_of(x.usage())}};
  }

  // One streamed event's object for choice `index` (`lp`: its logprobs).
  json chunk(size_t index, const json &delta_or_text, const json &finish, json lp = nullptr) const {
    json choice = {{"index", index}, {"finish_reason", finish}, {"logprobs", std::move(lp)}};
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
// every choice is complete, and meanwhile the provider checks every 200 ms that the client is
// still there, so that a client gone away cancels its request. The status is 200 by then: a
// generation that fails later (a plugin error, the server stopping) answers with an error body.
void answer_whole(httplib::Response &res, const std::shared_ptr<Exchange> &x, const Reply &reply) {
  {
    std::lock_guard<std::mutex> lock(x->m);
    if (x->done()) {
      if (const GenResult *f = x->failure()) return send_error(res, error_of(*f));
      return send_json(res, 200, reply.answer(*x));
    }
  }
  res.set_chunked_content_provider(
      "application/json",
      [x, reply](size_t, httplib::DataSink &sink) {
        std::unique_lock<std::mutex> lock(x->m);
        x->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return x->done(); });
        if (!x->done()) {
          lock.unlock();
          if (sink.is_writable()) return true;
          x->cancelled->store(true);
          return false;
        }
        const GenResult *f = x->failure();
        const json body = f ? error_body(error_of(*f)) : reply.answer(*x);
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

// What a stream has sent of one choice.
struct StreamedChoice {
  bool begun = false;     // its first event (a chat's role, a completion's echo) went out
  bool finished = false;  // its finish_reason went out
  size_t sent = 0;        // bytes of the tokens whose logprobs went out
  // With tools the answer is held until it is complete (its tool calls parsed out of it).
  std::string held;
  std::vector<TokenLogprob> held_logprobs;
};

// One choice's events for the text and logprobs taken from it (`done`: it has ended, with
// `result`); false when the client is gone.
bool write_choice(httplib::DataSink &sink, const Reply &reply, size_t index, StreamedChoice &sc,
                  std::string text, std::vector<TokenLogprob> lp, bool done, GenResult result) {
  json tool_calls = json::array();
  if (reply.tools) {
    sc.held += text;
    for (TokenLogprob &t : lp) sc.held_logprobs.push_back(std::move(t));
    text.clear();
    lp.clear();
    if (done && result.kind == GenResult::Kind::kOk) {
      ParsedAnswer a = reply.parsed(sc.held);
      text = std::move(a.content);
      lp.swap(sc.held_logprobs);
      for (size_t i = 0; i < a.tool_calls.size(); ++i) {
        json call = a.tool_calls[i];
        call["index"] = i;
        tool_calls.push_back(std::move(call));
      }
      if (!tool_calls.empty()) result.finish_reason = "tool_calls";
    }
  }
  bool ok = true;
  if (!sc.begun) {
    if (reply.chat)
      ok = write_event(sink, reply.chunk(index, {{"role", "assistant"}, {"content", ""}}, nullptr));
    else
      text = reply.echo_of(index) + text;
    sc.sent = reply.offset_of(index);
    sc.begun = true;
  }
  // Tokens without text yet (part of a character, text held back for a stop string) send
  // their logprobs with empty text.
  if (ok && (!text.empty() || (reply.logprobs && !lp.empty()))) {
    json logprobs = reply.logprobs_of(lp, sc.sent);
    for (const TokenLogprob &t : lp) sc.sent += t.bytes.size();
    ok = write_event(sink, reply.chunk(index, reply.chat ? json{{"content", text}} : json(text),
                                       nullptr, std::move(logprobs)));
  }
  if (ok && !tool_calls.empty())
    ok = write_event(sink, reply.chunk(index, {{"tool_calls", tool_calls}}, nullptr));
  if (ok && done && result.kind == GenResult::Kind::kOk) {
    ok = write_event(
        sink, reply.chunk(index, reply.chat ? json::object() : json(""), result.finish_reason));
    sc.finished = true;
  }
  return ok;
}

// Streaming: one SSE event per round and choice with text, a last one per choice with its
// finish_reason, then the usage (when asked for) and [DONE]; a choice that fails ends the stream
// with an error event.
void answer_stream(httplib::Response &res, const std::shared_ptr<Exchange> &x, const Reply &reply,
                   bool include_usage) {
  auto streamed = std::make_shared<std::vector<StreamedChoice>>(x->choices.size());
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [x, reply, streamed, include_usage](size_t, httplib::DataSink &sink) {
        std::unique_lock<std::mutex> lock(x->m);
        const auto news = [&] {
          for (size_t i = 0; i < x->choices.size(); ++i) {
            const Exchange::Choice &c = x->choices[i];
            if (!c.pending.empty() || !c.pending_logprobs.empty() ||
                (c.done && !(*streamed)[i].finished))
              return true;
          }
          return false;
        };
        x->cv.wait_for(lock, std::chrono::milliseconds(200), news);
        struct Taken {
          std::string text;
          std::vector<TokenLogprob> lp;
          bool done;
          GenResult result;
        };
        std::vector<Taken> taken(x->choices.size());
        for (size_t i = 0; i < taken.size(); ++i) {
          Exchange::Choice &c = x->choices[i];
          taken[i].text.swap(c.pending);
          taken[i].lp.swap(c.pending_logprobs);
          taken[i].done = c.done;
          taken[i].result = c.result;
        }
        const bool all_done = x->done();
        const GenResult *f = x->failure();
        const std::optional<GenResult> failure = f ? std::optional<GenResult>(*f) : std::nullopt;
        const GenResult usage = x->usage();
        lock.unlock();
        // A client that has gone away cancels its request; the engine ends it at the next round.
        if (!sink.is_writable()) {
          x->cancelled->store(true);
          return false;
        }
        bool ok = true;
        for (size_t i = 0; ok && i < taken.size(); ++i) {
          StreamedChoice &sc = (*streamed)[i];
          Taken &t = taken[i];
          if (sc.finished || (t.text.empty() && t.lp.empty() && !t.done && sc.begun)) continue;
          // With echo and logprobs the first event waits for the prompt's entries.
          if (reply.prompt_logprobs && !sc.begun && t.text.empty() && t.lp.empty() && !t.done)
            continue;
          ok = write_choice(sink, reply, i, sc, std::move(t.text), std::move(t.lp), t.done,
                            t.result);
        }
        if (ok && (failure || all_done)) {
          if (failure) {
            ok = write_event(sink, error_body(error_of(*failure)));
          } else if (include_usage) {
            json u = reply.chunk(0, nullptr, nullptr);
            u["choices"] = json::array();
            u["usage"] = usage_of(usage);
            ok = write_event(sink, u);
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
  // /tokenize ({"content": text, "add_special": bool} -> {"tokens": [ids]}) or /detokenize
  // ({"tokens": [ids]} -> {"content": text}), with the tokenizer of the model `model` names.
  void tokenize(const httplib::Request &req, httplib::Response &res, bool to_tokens);
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
  srv.Post("/tokenize", [this](const httplib::Request &req, httplib::Response &res) {
    tokenize(req, res, true);
  });
  srv.Post("/detokenize", [this](const httplib::Request &req, httplib::Response &res) {
    tokenize(req, res, false);
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
  static const char *const kKnown[] = {
      "/health",   "/v1/models",  "/v1/completions", "/v1/chat/completions",
      "/tokenize", "/detokenize", "/metrics"};
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
  // A job per prompt (a chat has the one it rendered), all queued together.
  std::vector<GenJob> jobs;
  if (chat) jobs.push_back(GenJob{params, {}});
  for (PromptInput &p : r.prompts) {
    jobs.push_back(GenJob{params, {}});
    jobs.back().params.prompt = std::move(p.text);
    jobs.back().params.prompt_tokens = std::move(p.tokens);
  }
  auto x = std::make_shared<Exchange>(jobs.size(), params.n);
  for (size_t i = 0; i < jobs.size(); ++i) jobs[i].callbacks = callbacks_for(x, i);
  const SubmitStatus st = model_entry.engine->submit(std::move(jobs), x->cancelled);
  if (st != SubmitStatus::kQueued) return send_error(res, not_queued(st, model_entry));
  std::vector<std::string> reply_echo;
  {
    // Every prompt accepted, or one refused (its choices ended with the error, which cancels
    // the others).
    std::unique_lock<std::mutex> lock(x->m);
    x->cv.wait(lock, [&] { return x->started() || x->failure(); });
    if (!x->started()) return send_error(res, error_of(*x->failure()));
    if (r.echo) reply_echo = x->prompt_texts;
  }

  Reply reply;
  reply.chat = chat;
  reply.id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  reply.created = std::time(nullptr);
  reply.model = model_entry.name;
  reply.logprobs = params.logprobs >= 0;
  reply.tools = tools;
  reply.echo = std::move(reply_echo);
  reply.per_prompt = static_cast<size_t>(params.n);
  reply.prompt_logprobs = params.prompt_logprobs;
  if (r.stream)
    answer_stream(res, x, reply, r.include_usage);
  else
    answer_whole(res, x, reply);
}

void Routes::tokenize(const httplib::Request &req, httplib::Response &res, bool to_tokens) {
  const json body = parse_bounded(req.body);
  if (body.is_discarded() || !body.is_object()) {
    ApiError e;
    e.message = "the body must be a JSON object";
    e.code = "invalid_json";
    return send_error(res, e);
  }
  size_t m = 0;
  if (auto e = pick_model(body, names_, &m)) return send_error(res, *e);
  Engine &engine = *cfg_.models[m].engine;
  std::string error;
  if (to_tokens) {
    const auto content = body.find("content");
    if (content == body.end() || !content->is_string())
      return send_error(res, bad_param("content", "content must be a string"));
    const auto special = body.find("add_special");
    if (special != body.end() && !special->is_null() && !special->is_boolean())
      return send_error(res, bad_param("add_special", "add_special must be true or false"));
    const bool add_special = special != body.end() && special->is_boolean() && special->get<bool>();
    std::vector<int32_t> ids;
    if (!engine.tokenize(content->get<std::string>(), add_special, &ids, &error))
      return send_error(res, bad_param("content", error));
    return send_json(res, 200, {{"tokens", ids}});
  }
  const auto tokens = body.find("tokens");
  std::vector<int32_t> ids;
  if (tokens != body.end() && tokens->is_array())
    for (const json &t : *tokens) {
      if (!t.is_number_integer() || t.get<int64_t>() < INT32_MIN || t.get<int64_t>() > INT32_MAX)
        return send_error(res, bad_param("tokens", "tokens must be a list of token ids"));
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  else
    return send_error(res, bad_param("tokens", "tokens must be a list of token ids"));
  std::string text;
  if (!engine.detokenize(ids, &text, &error)) return send_error(res, bad_param("tokens", error));
  send_json(res, 200, {{"content", text}});
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
  metric("specinfer_prompt_tokens_total", "counter", "Prompt tokens of the requests.",
         [](const EngineMetrics &m) { return m.prompt_tokens; });
  metric("specinfer_prompt_cached_tokens_total", "counter",
         "Prompt tokens a slot's cache held from its last request (not scored again).",
         [](const EngineMetrics &m) { return m.cached_tokens; });
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
