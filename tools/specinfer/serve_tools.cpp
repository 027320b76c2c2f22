// Tool calls in the Qwen2.5 / Hermes-style format (serve_tools.h).
#include "serve_tools.h"

#include <cctype>
#include <utility>

namespace serve {

using nlohmann::json;

namespace {

constexpr const char *kOpen = "<tool_call>";
constexpr const char *kClose = "</tool_call>";

std::string trimmed(const std::string &s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

bool valid_name(const std::string &name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

// The JSON text of a call's arguments, or "" when `call` is not a call: an object with a string
// `name` and an object `arguments` (or JSON text of one).
std::string arguments_of(const json &call) {
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string() ||
      !call.contains("arguments"))
    return "";
  json args = call["arguments"];
  if (args.is_string()) args = parse_bounded(args.get<std::string>());
  if (!args.is_object()) return "";
  return args.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::optional<ApiError> read_tools(const json &body, const nlohmann::ordered_json &ordered,
                                   bool chat, CompletionRequest *r) {
  const auto tools = body.find("tools");
  const auto choice = body.find("tool_choice");
  const bool has_tools =
      tools != body.end() && !tools->is_null() && !(tools->is_array() && tools->empty());
  if (!chat) {
    if (has_tools) return bad_param("tools", "tools are for /v1/chat/completions");
    if (choice != body.end() && !choice->is_null())
      return bad_param("tool_choice", "tool_choice is for /v1/chat/completions");
    return std::nullopt;
  }
  if (has_tools) {
    if (!tools->is_array() || tools->size() > kMaxTools)
      return bad_param("tools",
                       "tools must be a list of at most " + std::to_string(kMaxTools) + " tools");
    for (const json &t : *tools) {
      if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") ||
          !t["function"].is_object())
        return bad_param("tools",
                         "each tool must be {\"type\": \"function\", \"function\": {...}}");
      const json &f = t["function"];
      if (!f.contains("name") || !f["name"].is_string() ||
          !valid_name(f["name"].get<std::string>()))
        return bad_param("tools", "a function's name must be 1 to 64 letters, digits, '_' or '-'");
      if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
        return bad_param("tools", "a function's parameters must be a JSON Schema (an object)");
      if (f.contains("description") && !f["description"].is_null() && !f["description"].is_string())
        return bad_param("tools", "a function's description must be a string");
    }
    r->tools = ordered["tools"];
  }
  r->tool_choice = has_tools ? "auto" : "none";
  if (choice == body.end() || choice->is_null()) return std::nullopt;
  if (choice->is_string() && (*choice == "none" || *choice == "auto" || *choice == "required")) {
    r->tool_choice = choice->get<std::string>();
  } else if (choice->is_object() && choice->value("type", json()) == "function" &&
             choice->contains("function") && (*choice)["function"].is_object() &&
             (*choice)["function"].contains("name") && (*choice)["function"]["name"].is_string()) {
    r->tool_choice = "function";
    r->tool_function = (*choice)["function"]["name"].get<std::string>();
    bool known = false;
    for (const auto &t : r->tools) known = known || t["function"]["name"] == r->tool_function;
    if (!known)
      return bad_param("tool_choice", "tool_choice names the function '" + r->tool_function +
                                          "', which is not among the tools");
  } else {
    return bad_param("tool_choice",
                     "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": "
                     "\"function\", \"function\": {\"name\": ...}}");
  }
  if (r->tool_choice != "none" && !has_tools)
    return bad_param("tool_choice", "tool_choice \"" + r->tool_choice + "\" needs tools");
  return std::nullopt;
}

bool template_has_tool_calls(const std::string &template_source) {
  return template_source.find(kOpen) != std::string::npos &&
         template_source.find("tools") != std::string::npos;
}

std::string tool_call_grammar(const nlohmann::ordered_json &tools, const std::string &function) {
  using ojson = nlohmann::ordered_json;
  std::string rules, alternatives;
  size_t n = 0;
  for (const ojson &t : tools) {
    const ojson &f = t["function"];
    const std::string name = f["name"].get<std::string>();
    if (!function.empty() && name != function) continue;
    ojson params = f.contains("parameters") && f["parameters"].is_object()
                       ? f["parameters"]
                       : ojson{{"type", "object"}};
    const ojson schema = {{"type", "object"},
                          {"properties", {{"name", {{"const", name}}}, {"arguments", params}}},
                          {"required", {"name", "arguments"}},
                          {"additionalProperties", false}};
    std::string rule = "f";
    rule += std::to_string(n++);
    if (!alternatives.empty()) alternatives += " | ";
    alternatives += rule;
    rules += rule + ": %json " + schema.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  }
  return "start: call (\"\\n\" call)*\ncall: \"" + std::string(kOpen) + "\\n\" (" + alternatives +
         ") \"\\n" + kClose + "\"\n" + rules;
}

ParsedAnswer parse_tool_calls(const std::string &text, const std::string &id_prefix) {
  ParsedAnswer out;
  std::string content;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find(kOpen, pos);
    if (open == std::string::npos) break;
    const size_t body = open + std::string(kOpen).size();
    const size_t close = text.find(kClose, body);
    const size_t end =
        close == std::string::npos ? text.size() : close + std::string(kClose).size();
    const json call =
        parse_bounded(text.substr(body, (close == std::string::npos ? text.size() : close) - body));
    const std::string args = arguments_of(call);
    content += text.substr(pos, open - pos);
    if (args.empty()) {
      content += text.substr(open, end - open);  // not a call: it stays text
    } else {
      out.tool_calls.push_back(
          {{"id", id_prefix + std::to_string(out.tool_calls.size())},
           {"type", "function"},
           {"function", {{"name", call["name"].get<std::string>()}, {"arguments", args}}}});
    }
    pos = end;
  }
  if (pos < text.size()) content += text.substr(pos);
  out.content = trimmed(content);
  return out;
}

json messages_for_template(const json &messages) {
  json out = messages;
  for (json &m : out) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (json &call : m["tool_calls"]) {
      json *f = call.is_object() && call.contains("function") ? &call["function"] : &call;
      if (!f->is_object() || !f->contains("arguments") || !(*f)["arguments"].is_string()) continue;
      json args = parse_bounded((*f)["arguments"].get<std::string>());
      if (args.is_object()) (*f)["arguments"] = std::move(args);
    }
  }
  return out;
}

}  // namespace serve
