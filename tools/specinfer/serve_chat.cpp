// Chat templates (serve_chat.h): the GGUF's metadata read with the gguf plugin's reader, rendered
// by the MiniJinja static library when the build has it.
#include "serve_chat.h"

#include <exception>

#include "gguf/gguf_file.h"

#if SPECINFER_HAVE_CHAT_TEMPLATE
#include "chat_template.h"
#endif

namespace serve {

bool chat_templates_available() {
  return SPECINFER_HAVE_CHAT_TEMPLATE != 0;
}

bool ChatTemplate::render(const nlohmann::json &messages, std::string *out,
                          std::string *error) const {
#if SPECINFER_HAVE_CHAT_TEMPLATE
  const nlohmann::json context = {{"messages", messages},
                                  {"add_generation_prompt", true},
                                  {"bos_token", bos},
                                  {"eos_token", eos}};
  const std::string ctx = context.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
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

bool chat_template_from_gguf(const std::string &path, ChatTemplate *out, std::string *error) {
  try {
    const auto file = specinfer::gguf::File::open(path);
    out->source = file->get_string("tokenizer.chat_template").value_or("");
    const std::vector<std::string> tokens = file->get_string_array("tokenizer.ggml.tokens");
    const auto token = [&](const char *key) -> std::string {
      const auto id = file->get_int(key);
      return id && *id >= 0 && static_cast<size_t>(*id) < tokens.size() ? tokens[*id] : "";
    };
    out->bos = token("tokenizer.ggml.bos_token_id");
    out->eos = token("tokenizer.ggml.eos_token_id");
    return true;
  } catch (const std::exception &e) {
    *error = e.what();
    return false;
  }
}

}  // namespace serve
