// Chat prompts for `specinfer serve`: a model's Jinja chat template (the target's, from its
// GGUF's tokenizer.chat_template, or a file) rendered with MiniJinja (tools/chat-template) as
// Hugging Face transformers renders it with Jinja2: `messages`, `tools`, `add_generation_prompt`,
// `bos_token`, `eos_token`.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "specinfer.h"

namespace serve {

// True when the build has the template engine (cargo was found; see tools/CMakeLists.txt).
bool chat_templates_available();

struct ChatTemplate {
  std::string source;       // the Jinja template
  std::string bos, eos;     // the text of the model's bos and eos tokens
  bool model_adds_bos = 0;  // the model's tokenizer adds bos itself: a leading bos is dropped

  // Renders `messages` (an array of {role, content} objects) followed by the assistant's turn,
  // with `tools` (OpenAI's tool objects; null or empty: none) as the template's `tools`.
  // Returns false and the engine's message in *error when the template fails (raise_exception()
  // included) or the engine is not built in.
  bool render(const nlohmann::json &messages, const nlohmann::ordered_json &tools, std::string *out,
              std::string *error) const;
  // The prompt to feed: the rendered text less a leading bos when the tokenizer adds one itself
  // (a template that writes it too would give two).
  std::string prompt_of(std::string rendered) const;
};

// The token ids of `text` (special tokens parsed; bos added when add_special and the model asks
// for it). The target's status; *ids is left empty unless SPECINFER_OK.
specinfer_status tokenize(specinfer_target *target, const std::string &text, bool add_special,
                          std::vector<int32_t> *ids);
// The text (bytes) of `ids`. The target's status; *text is left empty unless SPECINFER_OK.
specinfer_status detokenize(specinfer_target *target, const std::vector<int32_t> &ids,
                            std::string *text);
// The text (bytes) of one token of an open target; "" for a negative id or when it cannot be had.
std::string token_text(specinfer_target *target, int32_t id);

// The chat template of an open target whose info is `info` (its chat_template; empty when it has
// none), the texts of its bos and eos tokens and whether its tokenizer adds bos.
void chat_template_of(specinfer_target *target, const specinfer_model_info &info,
                      ChatTemplate *out);

}  // namespace serve
