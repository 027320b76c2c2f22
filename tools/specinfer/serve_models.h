// The models `specinfer serve` serves by name: --target and --model NAME=PATH read into a list of
// named target specs, each with its drafter and chat template, and draft-model drafters whose draft
// model is a served model pointed at that model's own config, so that the registry opens the draft
// model on the served model's weights instead of loading them again.
#pragma once

#include <string>
#include <vector>

namespace serve {

struct ModelSpec {
  std::string name;           // the name requests give in `model`
  std::string target;         // PLUGIN:CONFIG, as it is opened
  std::string drafter;        // PLUGIN[:CONFIG]; "" = plain decoding
  std::string chat_template;  // a Jinja file; "" = the GGUF's own template
  std::string draft_shares;   // the served model whose loaded weights the draft model uses, or ""
};

// What the command line gave.
struct ModelOptions {
  std::string target;               // --target ("" when absent)
  std::vector<std::string> models;  // --model: NAME=PATH, NAME=PLUGIN:CONFIG, or NAME (--target's)
  std::vector<std::string> drafters;   // --drafter: SPEC (every model) or NAME=SPEC; "none" = none,
                                       // "auto" (or none given) = auto_drafter
  std::vector<std::string> templates;  // --chat-template: FILE (every model) or NAME=FILE
};

// The served models, --target's first (named by a bare --model NAME, else its file's name), then
// each --model NAME=... in order. A later --drafter or --chat-template for the same model (or for
// every model) replaces an earlier one; a per-model one wins over one for every model. Returns
// false with a usage message in *error: no model, a name given twice or not valid, a per-model
// option naming no served model.
bool read_models(const ModelOptions &options, std::vector<ModelSpec> *out, std::string *error);

// The drafter a served model gets when the command line names none for it (or names "auto"):
// Medusa heads with prompt lookup when a heads file for the target's GGUF is beside it (the
// target's path with ".gguf" replaced by ".medusa.gguf", as scripts/train-heads writes it),
// otherwise prompt lookup (ngram). Within a batch the draft budget lets a session draft only where
// that is expected to raise the tokens per second of the whole step.
std::string auto_drafter(const std::string &target);

// PATH, or a PLUGIN:CONFIG spec, as a target spec: an existing file or anything not of the form
// PLUGIN:KEY=... is a GGUF path.
std::string target_spec_of(const std::string &value);

// Writes every served model's config the way draft-model writes its draft model's (keys in its
// order, gguf's defaults vocab_limit=0 and requant=none spelled out: the same model as without
// them), so that equal configs are equal strings. Then every draft-model drafter whose draft model
// (its plugin= and path=) is a served model gets that model's config values, so that both open
// the same plugin and config and the registry loads the weights once: the draft model is the
// served model itself, its weights as served (not re-quantized) and its n_ctx. A drafter that asks
// for a different n_ctx, k, vocab_limit or requant, or a served model with a config key
// draft-model does not pass on (pack), keeps a copy of its own. Returns a line per such drafter
// saying which happened.
std::vector<std::string> share_draft_models(std::vector<ModelSpec> *models);

// "dir/qwen2.5-coder-0.5b.gguf" -> "qwen2.5-coder-0.5b".
std::string model_name_of(const std::string &path);

// The value of `key` in a PLUGIN:key=value,... spec; "" when absent.
std::string config_value(const std::string &spec, const std::string &key);

}  // namespace serve
