// The body of a /v1/completions or /v1/chat/completions request to `specinfer serve`, parsed and
// checked: JSON text in, the request the engine runs out, or the OpenAI-style error (HTTP status,
// message, param, code) the server answers with. No server is needed to run it, which is how
// tests/fuzz/fuzz_serve_request.cpp runs it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "serve_engine.h"

namespace serve {

// Limits of a request body.
constexpr int kMaxDepth = 64;               // most nesting of the JSON
constexpr int64_t kMaxMaxTokens = 1 << 24;  // max_tokens is 1..kMaxMaxTokens
constexpr float kMaxTemperature = 2;        // temperature is 0..kMaxTemperature
constexpr size_t kMaxStops = 16;            // most stop strings

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};

nlohmann::json error_body(const ApiError &e);

// JSON text parsed without exceptions: a discarded value for text that is not JSON or is nested
// deeper than kMaxDepth (*too_deep set then, when given). The parser itself does not recurse;
// later steps (dump, the template engine) walk values recursively, hence the bound.
nlohmann::json parse_bounded(const std::string &text, bool *too_deep = nullptr);

// A 400 naming the field `param` (code invalid_value).
ApiError bad_param(const std::string &param, const std::string &message);

// What a request gets for the fields it leaves out (or sets to null).
struct RequestDefaults {
  int32_t max_tokens = 128;
  float temperature = 0, top_p = 1;
  uint64_t seed = 0;
};

// Most prompts one completion request may list.
constexpr size_t kMaxPrompts = 32;

// One prompt of a completion: text, or token ids when `tokens` is not empty.
struct PromptInput {
  std::string text;
  std::vector<int32_t> tokens;
};

struct CompletionRequest {
  size_t model = 0;  // index into the served models' names
  // What the engine runs for each prompt, the prompt left empty: a completion's are in `prompts`
  // (1 .. kMaxPrompts, each with params.n choices); a chat's is `messages` rendered with the
  // model's chat template.
  GenParams params;
  std::vector<PromptInput> prompts;
  // Chat: the messages, each an object with a string `role` and a string `content` (text content
  // parts joined, null made ""), other fields kept as given.
  nlohmann::json messages = nlohmann::json::array();
  // Chat: the tools the model may call (OpenAI's shape, checked; empty: none) and tool_choice:
  // "none", "auto", "required", or "function" for the one named tool_function.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // in the client's key order
  std::string tool_choice = "none", tool_function;
  std::vector<std::string> stop;  // at most kMaxStops
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // a completion's text begins with its prompt
};

// The served model that a request's `model` field names: `models` are the served names. Absent
// or null picks the only model when there is one; otherwise an error: 400 (absent with several
// models, not a string) or 404 model_not_found.
std::optional<ApiError> pick_model(const nlohmann::json &body,
                                   const std::vector<std::string> &models, size_t *index);

// Parses `body` (any bytes) as a request to /v1/chat/completions (`chat`) or /v1/completions.
// Returns the error to answer with (400 invalid_json for text that is not a JSON object or is
// nested deeper than kMaxDepth, 400 naming the field for a bad or unsupported field, 404 for an
// unknown model) and leaves *out unspecified then; never throws on any body.
std::optional<ApiError> parse_completion_request(const std::string &body, bool chat,
                                                 const std::vector<std::string> &models,
                                                 const RequestDefaults &defaults,
                                                 CompletionRequest *out);

}  // namespace serve
