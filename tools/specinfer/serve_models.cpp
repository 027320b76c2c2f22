// The served models and their drafters (serve_models.h).
#include "serve_models.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "cli_options.h"

namespace serve {

namespace {

struct Kv {
  std::string key, value;
};

std::string trim(const std::string &s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// "a=1, b=2" -> {(a, 1), (b, 2)}; empty items dropped, as the plugins' config readers do.
std::vector<Kv> parse_config(const std::string &config) {
  std::vector<Kv> out;
  for (const std::string &item : cli::split(config, ',')) {
    if (trim(item).empty()) continue;
    const size_t eq = item.find('=');
    out.push_back(
        {trim(item.substr(0, eq)), eq == std::string::npos ? "" : trim(item.substr(eq + 1))});
  }
  return out;
}

std::string join_config(const std::vector<Kv> &kvs) {
  std::string out;
  for (const Kv &kv : kvs) {
    if (!out.empty()) out += ',';
    out += kv.key + "=" + kv.value;
  }
  return out;
}

// The value of `key` (the last one should it repeat; the plugin then refuses the config).
const Kv *find(const std::vector<Kv> &kvs, const std::string &key) {
  for (auto it = kvs.rbegin(); it != kvs.rend(); ++it)
    if (it->key == key) return &*it;
  return nullptr;
}

// True when some key appears more than once (the plugin refuses such a config).
bool repeats_a_key(const std::vector<Kv> &kvs) {
  for (size_t i = 0; i < kvs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (kvs[j].key == kvs[i].key) return true;
  return false;
}

bool same_file(const std::string &a, const std::string &b) {
  if (a == b) return true;
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec) && !ec;
}

// The keys draft-model passes on to its draft model's target, in the order it writes them.
const char *const kDraftTargetKeys[] = {"path", "n_ctx", "k", "vocab_limit", "requant"};

bool is_draft_target_key(const std::string &key) {
  return std::find(std::begin(kDraftTargetKeys), std::end(kDraftTargetKeys), key) !=
         std::end(kDraftTargetKeys);
}

// A name requests can give and /metrics can carry as a label value: printable ASCII without
// spaces, '=', '"' or '\'.
bool valid_name(const std::string &name) {
  if (name.empty() || name.size() > 256) return false;
  for (const char c : name)
    if (c <= ' ' || c > '~' || c == '=' || c == '"' || c == '\\') return false;
  return true;
}

ModelSpec *named(std::vector<ModelSpec> &models, const std::string &name) {
  for (ModelSpec &m : models)
    if (m.name == name) return &m;
  return nullptr;
}

// Applies NAME=VALUE options (per model) and VALUE ones (every model) in order: a per-model one
// wins over one for every model, a later one of a kind over an earlier one. A prefix before '='
// that names no served model makes the whole value one for every model unless it has no ':' (it
// then looks like a name: refused, so that a typo is not taken for a plugin or a file).
bool apply_per_model(std::vector<ModelSpec> &models, const std::vector<std::string> &values,
                     const char *option, bool value_may_have_eq, std::string ModelSpec::*field,
                     std::string *error) {
  std::string every;
  bool have_every = false;
  std::vector<std::pair<ModelSpec *, std::string>> own;
  for (const std::string &v : values) {
    const size_t eq = v.find('=');
    if (eq != std::string::npos) {
      const std::string name = v.substr(0, eq);
      if (ModelSpec *m = named(models, name)) {
        own.emplace_back(m, v.substr(eq + 1));
        continue;
      }
      if (!value_may_have_eq && name.find(':') == std::string::npos) {
        *error = std::string(option) + ": no served model is named '" + name + "'";
        return false;
      }
    }
    every = v;
    have_every = true;
  }
  for (ModelSpec &m : models)
    if (have_every) m.*field = every;
  for (auto &[m, value] : own) m->*field = value;
  return true;
}

}  // namespace

std::string model_name_of(const std::string &path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0)
    name.resize(name.size() - 5);
  return name;
}

std::string config_value(const std::string &spec, const std::string &key) {
  std::string plugin, config;
  cli::split_spec(spec, &plugin, &config);
  const std::vector<Kv> kvs = parse_config(config);
  const Kv *kv = find(kvs, key);
  return kv ? kv->value : "";
}

std::string target_spec_of(const std::string &value) {
  struct stat st;
  if (stat(value.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return "gguf:path=" + value;
  const size_t colon = value.find(':');
  const bool plugin_name =
      colon != std::string::npos && colon > 0 &&
      value.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
          colon;
  if (plugin_name && value.find('=', colon) != std::string::npos) return value;
  return "gguf:path=" + value;
}

bool read_models(const ModelOptions &o, std::vector<ModelSpec> *out, std::string *error) {
  std::vector<ModelSpec> models;
  std::string target_name;
  for (const std::string &m : o.models) {
    const size_t eq = m.find('=');
    if (eq != std::string::npos) continue;
    if (o.target.empty()) {
      *error = "--model " + m + ": a bare NAME names the --target model; give NAME=PATH";
      return false;
    }
    target_name = m;  // the last one, as for any repeated option
  }
  if (!o.target.empty()) {
    ModelSpec t;
    t.target = o.target;
    const std::string path = config_value(o.target, "path");
    t.name = !target_name.empty() ? target_name : !path.empty() ? model_name_of(path) : "specinfer";
    models.push_back(std::move(t));
  }
  for (const std::string &m : o.models) {
    const size_t eq = m.find('=');
    if (eq == std::string::npos) continue;
    ModelSpec s;
    s.name = m.substr(0, eq);
    const std::string value = m.substr(eq + 1);
    if (value.empty()) {
      *error = "--model " + m + ": no path after '='";
      return false;
    }
    s.target = target_spec_of(value);
    models.push_back(std::move(s));
  }
  if (models.empty()) {
    *error = "--target or --model NAME=PATH is required";
    return false;
  }
  for (size_t i = 0; i < models.size(); ++i) {
    if (!valid_name(models[i].name)) {
      *error = "--model: '" + models[i].name +
               "' is not a valid model name (printable ASCII without spaces, '=', '\"' or '\\')";
      return false;
    }
    for (size_t j = 0; j < i; ++j)
      if (models[j].name == models[i].name) {
        *error = "--model: the name '" + models[i].name + "' is given to two models";
        return false;
      }
  }
  if (!apply_per_model(models, o.drafters, "--drafter", false, &ModelSpec::drafter, error) ||
      !apply_per_model(models, o.templates, "--chat-template", true, &ModelSpec::chat_template,
                       error))
    return false;
  for (ModelSpec &m : models) {
    if (m.drafter.empty() || m.drafter == "auto")
      m.drafter = auto_drafter(m.target);
    else if (m.drafter == "none")
      m.drafter.clear();
  }
  *out = std::move(models);
  return true;
}

std::string auto_drafter(const std::string &target) {
  std::string plugin, config;
  cli::split_spec(target, &plugin, &config);
  const std::string path = config_value(target, "path");
  if (plugin == "gguf" && !path.empty()) {
    std::string heads = path;
    if (heads.size() > 5 && heads.compare(heads.size() - 5, 5, ".gguf") == 0)
      heads.resize(heads.size() - 5);
    heads += ".medusa.gguf";
    struct stat st;
    // A heads file's path in a config may hold no ',' (the config's separator).
    if (heads.find(',') == std::string::npos && stat(heads.c_str(), &st) == 0 &&
        S_ISREG(st.st_mode))
      return "medusa:path=" + heads + ",lookup=1";
  }
  return "ngram";
}

std::vector<std::string> share_draft_models(std::vector<ModelSpec> *models) {
  // Every served model whose config draft-model could write is written as draft-model writes it,
  // so that two names for one model, and a drafter's draft model, open the same config. One that
  // repeats a key stays as given, for its plugin to refuse, rather than keep one of the values.
  std::vector<bool> canonical(models->size(), false);
  for (size_t i = 0; i < models->size(); ++i) {
    ModelSpec &s = (*models)[i];
    std::string plugin, config;
    cli::split_spec(s.target, &plugin, &config);
    const std::vector<Kv> kvs = parse_config(config);
    if (!find(kvs, "path") || repeats_a_key(kvs) ||
        !std::all_of(kvs.begin(), kvs.end(),
                     [](const Kv &kv) { return is_draft_target_key(kv.key); }))
      continue;
    std::vector<Kv> out;
    for (const char *key : kDraftTargetKeys) {
      const std::string k = key;
      const Kv *kv = find(kvs, k);
      if (kv)
        out.push_back({k, k == "requant" && kv->value == "0" ? "none" : kv->value});
      else if (plugin == "gguf" && k == "vocab_limit")
        out.push_back({k, "0"});
      else if (plugin == "gguf" && k == "requant")
        out.push_back({k, "none"});
    }
    s.target = plugin + ":" + join_config(out);
    canonical[i] = true;
  }
  std::vector<std::string> notes;
  for (ModelSpec &m : *models) {
    std::string dplugin, dconfig;
    cli::split_spec(m.drafter, &dplugin, &dconfig);
    if (dplugin != "draft-model") continue;
    const std::vector<Kv> draft = parse_config(dconfig);
    if (repeats_a_key(draft)) continue;  // left for draft-model to refuse
    const Kv *p = find(draft, "plugin");
    const std::string model_plugin = p ? p->value : "gguf";
    const Kv *dpath = find(draft, "path");
    if (!dpath || dpath->value.empty()) continue;
    size_t served = models->size();
    std::vector<Kv> skvs;
    std::string splugin;
    // The first served model on that file whose config the drafter's keys agree with.
    std::string why;
    for (size_t i = 0; i < models->size(); ++i) {
      std::string config;
      cli::split_spec((*models)[i].target, &splugin, &config);
      skvs = parse_config(config);
      const Kv *spath = find(skvs, "path");
      if (splugin != model_plugin || !spath || !same_file(spath->value, dpath->value)) continue;
      std::string differs;
      if (!canonical[i]) {
        for (const Kv &kv : skvs)
          if (!is_draft_target_key(kv.key) && differs.empty())
            differs = "its config has " + kv.key + ", which draft-model does not pass on";
      } else {
        for (const Kv &kv : draft) {
          if (kv.key == "path" || !is_draft_target_key(kv.key) || !differs.empty()) continue;
          const Kv *c = find(skvs, kv.key);
          const std::string v = kv.key == "requant" && kv.value == "0" ? "none" : kv.value;
          if (!c || c->value != v)
            differs = "the drafter asks for " + kv.key + "=" + kv.value + ", the model has " +
                      (c ? kv.key + "=" + c->value : "no " + kv.key);
        }
      }
      if (differs.empty()) {
        served = i;
        break;
      }
      if (why.empty()) why = "served model " + (*models)[i].name + " differs: " + differs;
    }
    if (served == models->size()) {
      if (!why.empty())
        notes.push_back("model " + m.name + ": its draft model is loaded on its own (" + why + ")");
      continue;
    }
    std::vector<Kv> rewritten;
    for (const Kv &kv : draft)
      if (!is_draft_target_key(kv.key)) rewritten.push_back(kv);
    rewritten.insert(rewritten.end(), skvs.begin(), skvs.end());
    m.drafter = "draft-model:" + join_config(rewritten);
    m.draft_shares = (*models)[served].name;
    notes.push_back("model " + m.name + ": its draft model is served model " + m.draft_shares +
                    " (one copy of the weights)");
  }
  return notes;
}

}  // namespace serve
