// Chat templates (serve_chat.h): the target's template and bos / eos texts through the public API,
// rendered by the MiniJinja static library when the build has it.
#include "serve_chat.h"

#include <string>

#if SPECINFER_HAVE_CHAT_TEMPLATE
#include "chat_template.h"
#endif

namespace serve {

bool chat_templates_available() {
  return SPECINFER_HAVE_CHAT_TEMPLATE != 0;
}

bool ChatTemplate::render(const nlohmann::json &messages, const nlohmann::ordered_json &tools,
                          std::string *out, std::string *error) const {
#if SPECINFER_HAVE_CHAT_TEMPLATE
  // Ordered: the tools keep the keys' order the client gave them in when the template shows them.
  nlohmann::ordered_json context = {{"messages", messages},
                                    {"add_generation_prompt", true},
                                    {"bos_token", bos},
                                    {"eos_token", eos}};
  if (tools.is_array() && !tools.empty()) context["tools"] = tools;
  const std::string ctx =
      context.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  char *text = nullptr;
  size_t len = 0;
  const int rc = specinfer_chat_template_render(source.data(), source.size(), ctx.data(),
                                                ctx.size(), &text, &len);
  std::string result = text ? std::string(text, len) : std::string("out of memory");
  specinfer_chat_template_free(text);
  if (rc != 0) {
    *error = "the chat template failed: " + result;
    return false;
  }
  *out = std::move(result);
  return true;
#else
  (void)messages;
  (void)tools;
  (void)out;
  *error =
      "this build of specinfer has no chat-template engine (cargo was not found when it was built)";
  return false;
#endif
}

std::string ChatTemplate::prompt_of(std::string rendered) const {
  if (model_adds_bos && !bos.empty() && rendered.compare(0, bos.size(), bos) == 0)
    rendered.erase(0, bos.size());
  return rendered;
}

// The two calls of a sized output: the first asks for the size, the second fills it.
specinfer_status tokenize(specinfer_target *target, const std::string &text, bool add_special,
                          std::vector<int32_t> *ids) {
  const int32_t special = add_special ? 1 : 0;
  size_t n = 0;
  ids->clear();
  specinfer_status rc =
      specinfer_target_tokenize(target, text.data(), text.size(), special, 1, nullptr, 0, &n);
  if (rc == SPECINFER_ERR_BUFFER_TOO_SMALL || rc == SPECINFER_OK) {
    ids->resize(n);
    rc = specinfer_target_tokenize(target, text.data(), text.size(), special, 1, ids->data(),
                                   ids->size(), &n);
  }
  ids->resize(rc == SPECINFER_OK ? n : 0);
  return rc;
}

specinfer_status detokenize(specinfer_target *target, const std::vector<int32_t> &ids,
                            std::string *text) {
  size_t n = 0;
  text->clear();
  specinfer_status rc = specinfer_target_detokenize(target, ids.data(), ids.size(), nullptr, 0, &n);
  if (rc == SPECINFER_ERR_BUFFER_TOO_SMALL || rc == SPECINFER_OK) {
    text->resize(n);
    rc =
        specinfer_target_detokenize(target, ids.data(), ids.size(), text->data(), text->size(), &n);
  }
  text->resize(rc == SPECINFER_OK ? n : 0);
  return rc;
}

std::string token_text(specinfer_target *target, int32_t id) {
  if (id < 0) return "";
  std::string text;
  detokenize(target, {id}, &text);
  return text;
}

void chat_template_of(specinfer_target *target, const specinfer_model_info &info,
                      ChatTemplate *out) {
  out->source = info.chat_template ? info.chat_template : "";
  out->model_adds_bos = info.add_bos != 0;
  out->bos = token_text(target, info.bos_token);
  out->eos = token_text(target, info.eos_token);
}

}  // namespace serve
