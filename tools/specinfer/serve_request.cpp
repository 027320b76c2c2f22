// Request bodies of `specinfer serve`'s completion routes, parsed and checked (serve_request.h).
#include "serve_request.h"

#include <utility>

#include "serve_tools.h"

namespace serve {

using nlohmann::json;

json error_body(const ApiError &e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

json parse_bounded(const std::string &text, bool *too_deep) {
  bool deep = false;
  json j = json::parse(
      text,
      [&deep](int depth, json::parse_event_t, json &) {
        if (depth > kMaxDepth) deep = true;
        return !deep;
      },
      false);
  if (too_deep) *too_deep = deep;
  return deep ? json(json::value_t::discarded) : j;
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
  // Features this server does not have: refused rather than silently ignored, unless given as
  // off (false, 0 (best_of: 1), "", [] or {}).
  std::vector<std::string> refused = {"best_of",    "suffix",           "functions",
                                      "logit_bias", "presence_penalty", "frequency_penalty"};
  if (!chat) refused.push_back("top_logprobs");  // a chat's goes with its logprobs
  if (chat) refused.push_back("echo");           // a completion's only
  for (const std::string &key : refused) {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    const double off_number = key == "best_of" ? 1 : 0;
    const bool off = (it->is_boolean() && !it->get<bool>()) ||
                     (it->is_number() && it->get<double>() == off_number) ||
                     (it->is_string() && it->get<std::string>().empty()) ||
                     ((it->is_array() || it->is_object()) && it->empty());
    if (!off) return bad_param(key, key + " is not supported by this server");
  }
  if (const auto it = body.find("n"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > kMaxChoices)
      return bad_param("n", "n must be an integer from 1 to " + std::to_string(kMaxChoices));
    r->params.n = static_cast<int32_t>(it->get<int64_t>());
  }
  if (const auto it = body.find("echo"); !chat && it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad_param("echo", "echo must be true or false");
    r->echo = it->get<bool>();
  }
  return std::nullopt;
}

// A completion's prompt: a string, a list of token ids, or a list holding one of either.
std::optional<ApiError> read_prompt(const json &body, std::vector<PromptInput> *out) {
  const auto it = body.find("prompt");
  const auto token_ids = [](const json &v) {
    if (!v.is_array() || v.empty()) return false;
    for (const json &x : v)
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        return false;
    return true;
  };
  const auto one = [&](const json &v) {
    PromptInput p;
    if (v.is_string()) {
      p.text = v.get<std::string>();
      return p.text.empty() ? std::optional<PromptInput>() : std::optional<PromptInput>(p);
    }
    if (!token_ids(v)) return std::optional<PromptInput>();
    for (const json &x : v) p.tokens.push_back(static_cast<int32_t>(x.get<int64_t>()));
    return std::optional<PromptInput>(p);
  };
  const std::string what =
      "prompt must be a non-empty string or list of token ids (non-negative integers), or a list "
      "of 1 to " +
      std::to_string(kMaxPrompts) + " of them";
  if (it == body.end()) return bad_param("prompt", what);
  // A list of ids is one prompt; a list of strings or of id lists is several.
  const bool several = it->is_array() && !it->empty() && !token_ids(*it);
  if (!several) {
    auto p = one(*it);
    if (!p) return bad_param("prompt", what);
    out->push_back(std::move(*p));
    return std::nullopt;
  }
  if (it->size() > kMaxPrompts) return bad_param("prompt", what);
  for (const json &v : *it) {
    auto p = one(v);
    if (!p) return bad_param("prompt", what);
    out->push_back(std::move(*p));
  }
  return std::nullopt;
}

// Log-probabilities: a completion's `logprobs` is the number of alternatives per token (0 ..
// SPECINFER_MAX_TOP_LOGPROBS); a chat's is true or false, with the number in `top_logprobs`.
std::optional<ApiError> read_logprobs(const json &body, bool chat, GenParams *p) {
  const std::string range = "an integer from 0 to " + std::to_string(SPECINFER_MAX_TOP_LOGPROBS);
  const auto count = [&](const json &v) {
    return v.is_number_integer() && v.get<int64_t>() >= 0 &&
           v.get<int64_t>() <= SPECINFER_MAX_TOP_LOGPROBS;
  };
  const auto it = body.find("logprobs");
  const bool given = it != body.end() && !it->is_null();
  if (!chat) {
    if (!given || (it->is_boolean() && !it->get<bool>())) return std::nullopt;
    if (!count(*it)) return bad_param("logprobs", "logprobs must be " + range);
    p->logprobs = static_cast<int32_t>(it->get<int64_t>());
    return std::nullopt;
  }
  if (given && !it->is_boolean()) return bad_param("logprobs", "logprobs must be true or false");
  const bool on = given && it->get<bool>();
  int32_t top = 0;
  if (const auto t = body.find("top_logprobs"); t != body.end() && !t->is_null()) {
    if (!count(*t)) return bad_param("top_logprobs", "top_logprobs must be " + range);
    top = static_cast<int32_t>(t->get<int64_t>());
    if (top > 0 && !on) return bad_param("top_logprobs", "top_logprobs needs logprobs set to true");
  }
  if (on) p->logprobs = top;
  return std::nullopt;
}

// The constraint on the text: response_format (json_object, or json_schema with its schema), a
// Lark grammar (`grammar`) or a regular expression (`regex`), at most one of them.
std::optional<ApiError> read_constraint(const json &body, const nlohmann::ordered_json &ordered,
                                        GenParams *p) {
  const auto set = [&](const char *param, const char *kind,
                       std::string grammar) -> std::optional<ApiError> {
    if (!p->constraint_kind.empty())
      return bad_param(param, std::string("give at most one of response_format, grammar and "
                                          "regex (this request gives ") +
                                  p->constraint_param + " and " + param + ")");
    p->constraint_kind = kind;
    p->constraint = std::move(grammar);
    p->constraint_param = param;
    return std::nullopt;
  };
  if (const auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    const char *want =
        "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
        "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}";
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      return bad_param("response_format", want);
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "json_object") {
      if (auto e = set("response_format", "json_object", "")) return e;
    } else if (type == "json_schema") {
      const auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object() || !js->contains("schema") ||
          !((*js)["schema"].is_object() || (*js)["schema"].is_boolean()))
        return bad_param("response_format",
                         "response_format.json_schema.schema must be a JSON Schema (an object)");
      // The schema as the client wrote it: its properties' order is the order the text writes
      // them in.
      const std::string schema = ordered["response_format"]["json_schema"]["schema"].dump(
          -1, ' ', false, json::error_handler_t::replace);
      if (auto e = set("response_format", "json_schema", schema)) return e;
    } else if (type != "text") {
      return bad_param("response_format", want);
    }
  }
  for (const auto &[key, kind] : {std::pair{"grammar", "lark"}, std::pair{"regex", "regex"}}) {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_string() || it->get<std::string>().empty())
      return bad_param(key, std::string(key) + " must be a non-empty string");
    if (auto e = set(key, kind, it->get<std::string>())) return e;
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
  bool too_deep = false;
  const json body = parse_bounded(text, &too_deep);
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
  // Objects in the client's key order, where that order means something: a schema's properties
  // and the tools the template shows the model (`body`, a std::map, has them sorted).
  const auto ordered = nlohmann::ordered_json::parse(text, nullptr, false);
  if (auto e = read_constraint(body, ordered, &out->params)) return e;
  if (auto e = read_logprobs(body, chat, &out->params)) return e;
  if (auto e = read_tools(body, ordered, chat, out)) return e;
  if ((out->tool_choice == "required" || out->tool_choice == "function") &&
      !out->params.constraint_kind.empty())
    return bad_param("tool_choice", "tool_choice \"" + out->tool_choice +
                                        "\" constrains the text: it cannot go with " +
                                        out->params.constraint_param);
  // echo with logprobs: the prompt's tokens' log-probabilities come first.
  out->params.prompt_logprobs = out->echo && out->params.logprobs >= 0;
  if (chat) return read_messages(body, &out->messages);
  return read_prompt(body, &out->prompts);
}

}  // namespace serve
