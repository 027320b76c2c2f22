// Request bodies of `specinfer serve`'s completion routes, parsed and checked (serve_request.h).
#include "serve_request.h"

#include <utility>

namespace serve {

using nlohmann::json;

json error_body(const ApiError &e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

ApiError bad_param(const std::string &param, const std::string &message) {
  ApiError e;
  e.message = message;
  e.param = param;
  e.code = "invalid_value";
  return e;
}

namespace {

std::string quoted_names(const std::vector<std::string> &models) {
  std::string out;
  for (const std::string &m : models) out += (out.empty() ? "'" : ", '") + m + "'";
  return out;
}

// The fields both completion endpoints take.
std::optional<ApiError> read_sampling(const json &body, const RequestDefaults &defaults, bool chat,
                                      CompletionRequest *r) {
  GenParams &p = r->params;
  p.max_tokens = defaults.max_tokens;
  p.temperature = defaults.temperature;
  p.top_p = defaults.top_p;
  p.seed = defaults.seed;
  for (const char *key : {"max_tokens", "max_completion_tokens"}) {
    if (!chat && std::string(key) == "max_completion_tokens") continue;
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > kMaxMaxTokens)
      return bad_param(
          key, std::string(key) + " must be an integer from 1 to " + std::to_string(kMaxMaxTokens));
    p.max_tokens = static_cast<int32_t>(it->get<int64_t>());
  }
  if (const auto it = body.find("temperature"); it != body.end() && !it->is_null()) {
    if (!it->is_number() || !(it->get<double>() >= 0 && it->get<double>() <= kMaxTemperature))
      return bad_param("temperature", "temperature must be a number from 0 to 2");
    p.temperature = it->get<float>();
  }
  if (const auto it = body.find("top_p"); it != body.end() && !it->is_null()) {
    if (!it->is_number() || !(it->get<double>() > 0 && it->get<double>() <= 1))
      return bad_param("top_p", "top_p must be a number greater than 0 and at most 1");
    p.top_p = it->get<float>();
  }
  if (const auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return bad_param("seed", "seed must be an integer");
    p.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r->stop.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= kMaxStops) {
      for (const json &x : *it) {
        if (!x.is_string()) return bad_param("stop", "stop must be a string or a list of strings");
        r->stop.push_back(x.get<std::string>());
      }
    } else {
      return bad_param("stop", "stop must be a string or a list of at most " +
                                   std::to_string(kMaxStops) + " strings");
    }
  }
  if (const auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad_param("stream", "stream must be true or false");
    r->stream = it->get<bool>();
  }
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad_param("stream_options", "stream_options must be an object");
    const auto u = it->find("include_usage");
    if (u != it->end() && !u->is_null()) {
      if (!u->is_boolean())
        return bad_param("stream_options", "stream_options.include_usage must be true or false");
      r->include_usage = u->get<bool>();
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

std::optional<ApiError> read_messages(const json &body, json *out) {
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    return bad_param("messages", "messages must be a non-empty list");
  *out = json::array();
  for (const json &m : *it) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return bad_param("messages", "each message must be an object with a role");
    json msg = m;
    const json content = m.value("content", json(nullptr));
    if (content.is_array()) {  // content parts: the text ones, joined
      std::string text;
      for (const json &part : content) {
        // (part["type"] compared as JSON: value("type", "") would throw on a type that is not a
        // string.)
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string())
          return bad_param("messages", "only text content parts are supported");
        text += part["text"].get<std::string>();
      }
      msg["content"] = text;
    } else if (content.is_null()) {
      msg["content"] = "";
    } else if (!content.is_string()) {
      return bad_param("messages", "a message's content must be a string");
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> pick_model(const json &body, const std::vector<std::string> &models,
                                   size_t *index) {
  const auto it = body.find("model");
  if (it == body.end() || it->is_null()) {
    if (models.size() == 1) {
      *index = 0;
      return std::nullopt;
    }
    ApiError e;
    e.message = "you must give a model: this server has " + quoted_names(models);
    e.param = "model";
    return e;
  }
  if (!it->is_string()) return bad_param("model", "model must be a string");
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i] == it->get<std::string>()) {
      *index = i;
      return std::nullopt;
    }
  ApiError e;
  e.status = 404;
  e.message = "the model '" + it->get<std::string>() + "' does not exist; this server has " +
              (models.size() == 1 ? "" : "the models ") + quoted_names(models);
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

std::optional<ApiError> parse_completion_request(const std::string &text, bool chat,
                                                 const std::vector<std::string> &models,
                                                 const RequestDefaults &defaults,
                                                 CompletionRequest *out) {
  // Nesting deeper than kMaxDepth is refused while parsing (the parser itself does not recurse):
  // later steps (dump, the template engine) walk values recursively.
  bool too_deep = false;
  const json body = json::parse(
      text,
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
    return e;
  }
  *out = CompletionRequest();
  if (auto e = pick_model(body, models, &out->model)) return e;
  if (auto e = read_sampling(body, defaults, chat, out)) return e;
  if (chat) return read_messages(body, &out->messages);
  const auto it = body.find("prompt");
  if (it != body.end() && it->is_string()) {
    out->params.prompt = it->get<std::string>();
  } else if (it != body.end() && it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    out->params.prompt = (*it)[0].get<std::string>();
  } else {
    return bad_param("prompt", "prompt must be a string (or a list of one)");
  }
  if (out->params.prompt.empty()) return bad_param("prompt", "prompt must not be empty");
  return std::nullopt;
}

}  // namespace serve
