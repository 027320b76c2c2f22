// Fuzz target: `specinfer serve`'s parsing of a completion request body
// (tools/specinfer/serve_request.cpp), as /v1/completions and as /v1/chat/completions, with one
// served model and with two. The only failure allowed is the parse error it returns: an
// OpenAI-style error with status 400 or 404, a message and a field name from the request's own
// fields; it never throws. An accepted request is within bounds: max_tokens 1..2^24,
// temperature 0..2, top_p in (0, 1], at most 16 stop strings, a model that is served, a non-empty
// prompt, or non-empty messages each with a string role and string content, a known constraint
// kind, logprobs in range, tools only with a chat. The values it accepts are the body's own (the
// defaults where the body has none). The same bytes read as a model's answer give tool calls
// (serve_tools.cpp) whose arguments are JSON objects, without throwing.
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "serve_request.h"
#include "serve_tools.h"

namespace {

using nlohmann::json;

const std::set<std::string> kParams = {"",
                                       "model",
                                       "max_tokens",
                                       "max_completion_tokens",
                                       "temperature",
                                       "top_p",
                                       "seed",
                                       "stop",
                                       "stream",
                                       "stream_options",
                                       "echo",
                                       "logprobs",
                                       "best_of",
                                       "suffix",
                                       "tools",
                                       "functions",
                                       "n",
                                       "prompt",
                                       "messages",
                                       "top_logprobs",
                                       "logit_bias",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "response_format",
                                       "grammar",
                                       "regex",
                                       "tool_choice"};

void check_error(const serve::ApiError &e) {
  FUZZ_CHECK(e.status == 400 || e.status == 404);
  FUZZ_CHECK(!e.message.empty());
  FUZZ_CHECK(e.type == "invalid_request_error");
  FUZZ_CHECK(kParams.count(e.param) == 1);
  FUZZ_CHECK((e.status == 404) == (e.code == "model_not_found"));
  // The error body is what the server sends: it must dump (invalid UTF-8 replaced).
  const std::string text =
      serve::error_body(e).dump(-1, ' ', false, json::error_handler_t::replace);
  FUZZ_CHECK(json::parse(text)["error"].size() == 4);
}

// The body's value of `key` when it is present and not null.
const json *field(const json &body, const char *key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

void check_request(const std::string &text, bool chat, const std::vector<std::string> &models,
                   const serve::RequestDefaults &d, const serve::CompletionRequest &r) {
  const serve::GenParams &p = r.params;
  FUZZ_CHECK(r.model < models.size());
  FUZZ_CHECK(p.max_tokens >= 1 && p.max_tokens <= serve::kMaxMaxTokens);
  FUZZ_CHECK(p.temperature >= 0 && p.temperature <= serve::kMaxTemperature);
  FUZZ_CHECK(p.top_p > 0 && p.top_p <= 1);
  FUZZ_CHECK(r.stop.size() <= serve::kMaxStops);
  FUZZ_CHECK(p.prompt.empty() && p.prompt_tokens.empty());  // the prompts are elsewhere
  if (chat) {
    FUZZ_CHECK(r.prompts.empty());
    FUZZ_CHECK(r.messages.is_array() && !r.messages.empty());
    for (const json &m : r.messages) {
      FUZZ_CHECK(m.is_object() && m["role"].is_string() && m["content"].is_string());
    }
  } else {
    // 1 .. kMaxPrompts prompts, each text or token ids.
    FUZZ_CHECK(!r.prompts.empty() && r.prompts.size() <= serve::kMaxPrompts);
    for (const serve::PromptInput &q : r.prompts) {
      FUZZ_CHECK(q.text.empty() != q.tokens.empty());
      for (const int32_t id : q.tokens) FUZZ_CHECK(id >= 0);
    }
    FUZZ_CHECK(r.messages.empty());
  }
  FUZZ_CHECK(p.n >= 1 && p.n <= serve::kMaxChoices);
  FUZZ_CHECK(!(r.echo && chat));
  FUZZ_CHECK(p.prompt_logprobs == (r.echo && p.logprobs >= 0));
  FUZZ_CHECK(p.logprobs >= -1 && p.logprobs <= SPECINFER_MAX_TOP_LOGPROBS);
  static const std::set<std::string> kKinds = {"", "json_object", "json_schema", "lark", "regex"};
  FUZZ_CHECK(kKinds.count(p.constraint_kind) == 1);
  FUZZ_CHECK(p.constraint_kind.empty() == p.constraint_param.empty());
  FUZZ_CHECK(r.tool_choice == "none" || (chat && !r.tools.empty()));
  if (r.tool_choice == "required" || r.tool_choice == "function") {
    FUZZ_CHECK(p.constraint_kind.empty());
    const std::string g = serve::tool_call_grammar(r.tools, r.tool_function);
    FUZZ_CHECK(g.find("%json") != std::string::npos);
  }
  // An accepted body is a JSON object: its values are the ones accepted.
  const json body = json::parse(text);
  FUZZ_CHECK(body.is_object());
  const json *model = field(body, "model");
  FUZZ_CHECK(model ? model->get<std::string>() == models[r.model] : models.size() == 1);
  const json *mt = field(
      body, chat && field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens");
  FUZZ_CHECK(p.max_tokens == (mt ? mt->get<int64_t>() : d.max_tokens));
  const json *t = field(body, "temperature");
  FUZZ_CHECK(p.temperature == (t ? t->get<float>() : d.temperature));
  const json *tp = field(body, "top_p");
  FUZZ_CHECK(p.top_p == (tp ? tp->get<float>() : d.top_p));
  const json *seed = field(body, "seed");
  FUZZ_CHECK(p.seed ==
             (seed ? static_cast<uint64_t>(seed->is_number_unsigned() ? seed->get<uint64_t>()
                                                                      : seed->get<int64_t>())
                   : d.seed));
  const json *stop = field(body, "stop");
  FUZZ_CHECK(r.stop.size() == (stop ? (stop->is_string() ? 1 : stop->size()) : 0));
  const json *stream = field(body, "stream");
  FUZZ_CHECK(r.stream == (stream && stream->get<bool>()));
  if (!chat) {  // a string, token ids, or a list of either
    const json &given = body["prompt"];
    const bool several = given.is_array() && !given.empty() && !given[0].is_number();
    FUZZ_CHECK(r.prompts.size() == (several ? given.size() : 1));
    for (size_t k = 0; k < r.prompts.size(); ++k) {
      const json &one = several ? given[k] : given;
      const serve::PromptInput &q = r.prompts[k];
      if (one.is_string()) {
        FUZZ_CHECK(q.text == one.get<std::string>());
      } else {
        FUZZ_CHECK(one.size() == q.tokens.size());
        for (size_t i = 0; i < one.size(); ++i) FUZZ_CHECK(one[i].get<int64_t>() == q.tokens[i]);
      }
    }
  }
  const json *n = field(body, "n");
  FUZZ_CHECK(p.n == (n ? n->get<int64_t>() : 1));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  serve::RequestDefaults d;
  d.max_tokens = 64;
  d.temperature = 0.5f;
  d.top_p = 0.9f;
  d.seed = 42;
  const std::vector<std::vector<std::string>> servers = {{"qwen"}, {"qwen2.5-coder-0.5b", "gemma"}};
  for (const std::vector<std::string> &models : servers) {
    for (const bool chat : {false, true}) {
      serve::CompletionRequest r;
      if (const auto e = serve::parse_completion_request(text, chat, models, d, &r)) {
        check_error(*e);
        continue;
      }
      check_request(text, chat, models, d, r);
    }
  }
  // The same bytes as a model's answer: tool calls parsed out of it never throw, and each has a
  // name and arguments that are a JSON object's text.
  const serve::ParsedAnswer a = serve::parse_tool_calls(text, "call_");
  for (const json &call : a.tool_calls) {
    FUZZ_CHECK(call["function"]["name"].is_string());
    FUZZ_CHECK(json::parse(call["function"]["arguments"].get<std::string>()).is_object());
  }
  FUZZ_CHECK(a.content.size() <= text.size());
  return 0;
}
