// Tool calls for `specinfer serve`'s chat route, in the format of the Qwen2.5 (Hermes-style) chat
// templates: the request's tools go to the template as `tools`; the model writes each call as
// <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>. With tool_choice "required" or a
// named function the text is constrained to such calls (a Lark grammar with each function's
// parameters as an inline JSON Schema); with "auto" the model chooses, and its text is parsed
// afterwards. Functions of the request and the text alone, so that the fuzz targets run them.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "serve_request.h"

namespace serve {

// Most tools in one request.
constexpr size_t kMaxTools = 64;

// A chat request's `tools` and `tool_choice`, checked in `body`, into r->tools (from `ordered`, the
// same body with its keys in the client's order), tool_choice and tool_function; on a completion
// request tools are refused. The error names the field.
std::optional<ApiError> read_tools(const nlohmann::json &body,
                                   const nlohmann::ordered_json &ordered, bool chat,
                                   CompletionRequest *r);

// Whether a chat template writes tool calls in the format parse_tool_calls reads.
bool template_has_tool_calls(const std::string &template_source);

// The Lark grammar (llguidance's dialect) whose texts are one or more tool calls of `tools`
// (only `function` when it is not empty), each call's arguments valid for its function's
// `parameters` schema (any JSON object when it has none).
std::string tool_call_grammar(const nlohmann::ordered_json &tools, const std::string &function);

// A model's answer split into its text and its tool calls: every <tool_call> block whose body is
// a JSON object with a string `name` and an object `arguments` (or a string holding one) becomes
// {"id": id_prefix + index, "type": "function", "function": {"name", "arguments": JSON text}}; the
// text is what lies outside those blocks, trimmed. Never throws.
struct ParsedAnswer {
  std::string content;
  nlohmann::json tool_calls = nlohmann::json::array();
};
ParsedAnswer parse_tool_calls(const std::string &text, const std::string &id_prefix);

// The request's messages as the template reads them: an assistant message's tool call whose
// `arguments` is JSON text (as OpenAI clients send it) gets the parsed object instead.
nlohmann::json messages_for_template(const nlohmann::json &messages);

}  // namespace serve
