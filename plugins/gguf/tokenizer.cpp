#include "tokenizer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <queue>

#include "tokenizer_pretokenizer.h"
#include "unicode.h"

namespace specinfer::gguf {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Pre-tokenizers of the Llama 3 kind: a word that is a token as a whole skips the merges, and
// BOS is added by default.
bool is_llama3_family(std::string_view pre) {
  for (const char *name : {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral"}) {
    if (pre == name) return true;
  }
  return false;
}

// The spelling lists below follow llama.cpp's vocabulary loader (the version the reference data in
// tests/data/reference was made with: llama-cpp-python 0.3.36). llama.cpp makes every token
// spelt like one of them a control token whatever type the file gives it, so that it renders as
// nothing with special = false and is cut out of the text only with parse_special. That includes
// plain-looking spellings such as "</s>" (listed for PaddleOCR), which Qwen2.5 has as a normal
// token (id 128247) and Gemma 3 as a user-defined one (id 212).

// End of turn; the first present is eot() when the file names none.
constexpr const char *kEndOfTurn[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<end_of_turn>",
    "<|end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "<end_of_utterance>",
};

// Fill-in-middle markers (prefix, suffix, middle, pad, repository, file separator).
constexpr const char *kFillInMiddle[] = {
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\xEF\xBD\x9C"
    "fim\xE2\x96\x81"
    "begin\xEF\xBD\x9C>",
    "<PRE>",
    "\xE2\x96\x81<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\xEF\xBD\x9C"
    "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
    "<SUF>",
    "\xE2\x96\x81<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\xEF\xBD\x9C"
    "fim\xE2\x96\x81"
    "end\xEF\xBD\x9C>",
    "<MID>",
    "\xE2\x96\x81<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
};

// Fill-in-middle markers that also end generation (pad, repository, file separator).
constexpr const char *kFillInMiddleEnd[] = {
    "<|fim_pad|>",   "<fim-pad>",  "<fim_pad>", "<PAD>",      "[PAD]",        "<|fim_repo|>",
    "<|repo_name|>", "<fim-repo>", "<REPO>",    "<reponame>", "<|file_sep|>",
};

// Spellings that end generation when present.
constexpr const char *kEndOfGeneration[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "[e~[",
};

// Spellings llama.cpp always makes user-defined (rendered even with special = false; gpt-oss).
constexpr const char *kUserDefinedByName[] = {"<|channel|>", "<|message|>", "<|start|>",
                                              "<|constrain|>"};

// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[i];
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return -1;
    value = value * 16 + d;
  }
  return value;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const File &f) {
  TokenizerSpec spec;
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model) fail(SPECINFER_ERR_FORMAT, "tokenizer: the file has no tokenizer.ggml.model");
  spec.model = *model;
  spec.pre = f.get_string("tokenizer.ggml.pre").value_or("");
  spec.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (spec.tokens.empty())
    fail(SPECINFER_ERR_FORMAT, "tokenizer: the file has no tokenizer.ggml.tokens");
  spec.scores = f.get_float_array("tokenizer.ggml.scores");
  for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) {
    spec.types.push_back(static_cast<int32_t>(std::clamp<int64_t>(t, -1, 1000)));
  }
  if (spec.model == "gpt2") {
    if (!f.has("tokenizer.ggml.merges"))
      fail(SPECINFER_ERR_FORMAT, "tokenizer: BPE vocabulary without tokenizer.ggml.merges");
    spec.merges = f.get_string_array("tokenizer.ggml.merges");
  }
  const auto id_key = [&](const char *key, std::optional<int32_t> &out) {
    if (auto v = f.get_int(key)) {
      out = (*v >= 0 && *v < static_cast<int64_t>(spec.tokens.size())) ? static_cast<int32_t>(*v)
                                                                       : -1;
    }
  };
  id_key("tokenizer.ggml.bos_token_id", spec.bos);
  id_key("tokenizer.ggml.eos_token_id", spec.eos);
  id_key("tokenizer.ggml.eot_token_id", spec.eot);
  id_key("tokenizer.ggml.eom_token_id", spec.eom);
  id_key("tokenizer.ggml.unknown_token_id", spec.unk);
  id_key("tokenizer.ggml.padding_token_id", spec.pad);
  spec.add_bos = f.get_bool("tokenizer.ggml.add_bos_token");
  spec.add_eos = f.get_bool("tokenizer.ggml.add_eos_token");
  spec.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix");
  return from_spec(std::move(spec));
}

std::unique_ptr<Tokenizer> Tokenizer::from_spec(TokenizerSpec spec) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->build(spec);
  return t;
}

void Tokenizer::build(TokenizerSpec &spec) {
  build_vocabulary(spec);
  build_special_ids(spec);
  const std::vector<bool> has_key = build_token_bytes();
  if (kind_ == Kind::Bpe)
    build_bpe_merges(spec.merges, has_key);
  else
    build_spm_byte_fallback();
  build_special_trie();
}

// The kind, the spellings, scores and types of the tokens, and the lookup by spelling.
void Tokenizer::build_vocabulary(TokenizerSpec &spec) {
  if (spec.model == "gpt2") {
    kind_ = Kind::Bpe;
  } else if (spec.model == "llama") {
    kind_ = Kind::Spm;
  } else {
    fail(SPECINFER_ERR_UNSUPPORTED,
         "tokenizer: unsupported tokenizer model '%s' (supported: gpt2, llama)",
         spec.model.c_str());
  }
  const size_t n = spec.tokens.size();
  if (n == 0) fail(SPECINFER_ERR_FORMAT, "tokenizer: empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX))
    fail(SPECINFER_ERR_FORMAT, "tokenizer: vocabulary too large");
  if (!spec.scores.empty() && spec.scores.size() != n) {
    fail(SPECINFER_ERR_FORMAT, "tokenizer: %zu scores for %zu tokens", spec.scores.size(), n);
  }
  if (!spec.types.empty() && spec.types.size() != n) {
    fail(SPECINFER_ERR_FORMAT, "tokenizer: %zu token types for %zu tokens", spec.types.size(), n);
  }

  texts_ = std::move(spec.tokens);
  scores_ = spec.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(spec.scores);
  types_.assign(n, TokenType::Normal);
  for (size_t i = 0; i < n; ++i) {
    // An empty spelling would match everywhere; llama.cpp renames it the same way.
    if (texts_[i].empty()) texts_[i] = "[EMPTY_" + std::to_string(i) + "]";
    if (!spec.types.empty()) {
      const int32_t ty = spec.types[i];
      types_[i] = (ty >= 0 && ty <= 6) ? static_cast<TokenType>(ty) : TokenType::Undefined;
    }
  }
  by_text_.build(&texts_, std::vector<bool>(n, true));
  const auto make_control = [&](const char *name) {
    const int32_t id = find_token(name);
    if (id >= 0) types_[id] = TokenType::Control;
  };
  for (const char *name : kEndOfTurn) make_control(name);
  make_control("<|eom_id|>");
  for (const char *name : kFillInMiddle) make_control(name);
  for (const char *name : kEndOfGeneration) make_control(name);
  for (const char *name : kUserDefinedByName) {
    const int32_t id = find_token(name);
    if (id >= 0) types_[id] = TokenType::UserDefined;
  }
}

// Special ids and flags: llama.cpp's defaults, then the file's values; the end-of-generation set.
void Tokenizer::build_special_ids(const TokenizerSpec &spec) {
  const size_t n = texts_.size();
  const auto valid = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n ? id : -1; };
  if (kind_ == Kind::Spm) {
    bos_ = valid(1);
    eos_ = valid(2);
    unk_ = valid(0);
    add_bos_ = true;
    add_eos_ = false;
    add_space_prefix_ = true;
  } else {
    pre_ = spec.pre.empty() ? "default" : spec.pre;
    ignore_merges_ = is_llama3_family(pre_);
    add_bos_ = ignore_merges_;
    add_eos_ = false;
    add_space_prefix_ = false;
  }
  if (spec.bos) bos_ = valid(*spec.bos);
  if (spec.eos) eos_ = valid(*spec.eos);
  if (spec.eot) eot_ = valid(*spec.eot);
  if (spec.eom) eom_ = valid(*spec.eom);
  if (spec.unk) unk_ = valid(*spec.unk);
  if (spec.pad) pad_ = valid(*spec.pad);
  if (spec.add_bos) add_bos_ = *spec.add_bos;
  if (spec.add_eos) add_eos_ = *spec.add_eos;
  if (spec.add_space_prefix) add_space_prefix_ = *spec.add_space_prefix;
  if (eot_ < 0) {
    for (const char *name : kEndOfTurn) {
      if ((eot_ = find_token(name)) >= 0) break;
    }
  }
  if (eom_ < 0) eom_ = find_token("<|eom_id|>");
  for (int32_t id : {eos_, eot_, eom_}) {
    if (id >= 0) eog_.push_back(id);
  }
  for (const char *name : kEndOfGeneration) {
    const int32_t id = find_token(name);
    if (id >= 0) eog_.push_back(id);
  }
  for (const char *name : kFillInMiddleEnd) {
    const int32_t id = find_token(name);
    if (id >= 0) eog_.push_back(id);
  }
  // llama.cpp's exceptions: with "<|return|>" and "<|call|>" (gpt-oss), or "<|calls|>" and
  // "<|flush|>" (Solar Open), "<|end|>" does not end generation and is user-defined; with
  // "<|tool_response>" (Gemma 4) or "<|plamo:eos|>" (PLaMo), "</s>" is a normal token.
  const auto present = [&](const char *name) { return find_token(name) >= 0; };
  const auto demote = [&](const char *name, TokenType to) {
    const int32_t id = find_token(name);
    if (id < 0) return;
    eog_.erase(std::remove(eog_.begin(), eog_.end(), id), eog_.end());
    types_[id] = to;
  };
  const bool call = present("<|call|>") || present("<|calls|>");
  if (present("<|end|>") && call && (present("<|return|>") || present("<|flush|>"))) {
    demote("<|end|>", TokenType::UserDefined);
  }
  if (present("<|tool_response>") || present("<|plamo:eos|>")) demote("</s>", TokenType::Normal);
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());
}

// What each token stands for (bytes_), and for BPE the table the merges look tokens up in
// (keys_); returns which tokens have a key.
std::vector<bool> Tokenizer::build_token_bytes() {
  const size_t n = texts_.size();
  bytes_.resize(n);
  std::vector<bool> has_key(n, false);
  if (kind_ == Kind::Bpe) keys_.resize(n);
  std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
  std::fill(std::begin(byte_fallback_), std::end(byte_fallback_), -1);
  for (size_t i = 0; i < n; ++i) {
    const std::string &text = texts_[i];
    const TokenType ty = types_[i];
    const bool spelt =
        ty == TokenType::Control || ty == TokenType::Unknown || ty == TokenType::UserDefined;
    if (kind_ == Kind::Bpe) {
      // Words reach the vocabulary in byte-level spelling, so any token whose spelling decodes
      // to bytes can be looked up by those bytes.
      std::optional<std::string> raw = unicode::byte_level_to_bytes(text);
      if (spelt)
        bytes_[i] = text;
      else if (ty == TokenType::Normal || ty == TokenType::Byte)
        bytes_[i] = raw ? *raw : text;
      if (raw) {
        keys_[i] = std::move(*raw);
        has_key[i] = true;
      }
    } else {
      if (spelt) {
        bytes_[i] = text;
      } else if (ty == TokenType::Normal) {
        bytes_[i] = replace_all(text, kSpmSpace, " ");
      } else if (ty == TokenType::Byte) {
        const int b = parse_byte_token(text);
        bytes_[i] = b >= 0 ? std::string(1, static_cast<char>(b)) : text;
      }
    }
  }
  return has_key;
}

// The BPE merges by pair of token ids, the byte tokens and the pre-tokenizer.
void Tokenizer::build_bpe_merges(const std::vector<std::string> &merges,
                                 const std::vector<bool> &has_key) {
  by_key_.build(&keys_, has_key);
  for (int b = 0; b < 256; ++b) byte_token_[b] = lookup(std::string(1, static_cast<char>(b)));
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string &m = merges[r];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos) continue;
    auto left = unicode::byte_level_to_bytes(std::string_view(m).substr(0, space));
    auto right = unicode::byte_level_to_bytes(std::string_view(m).substr(space + 1));
    if (!left || !right) continue;
    const int32_t l = lookup(*left), rr = lookup(*right), res = lookup(*left + *right);
    // A merge whose parts or result are not tokens can never produce a token; skip it.
    if (l < 0 || rr < 0 || res < 0) continue;
    merges_.try_emplace(pair_key(l, rr),
                        Merge{static_cast<int32_t>(std::min<size_t>(r, INT32_MAX)), res});
  }
  bool known = false;
  pretok_ = std::make_unique<PreTokenizer>(PreTokenizer::patterns_for(pre_, &known));
}

// The token of each byte for SentencePiece's byte fallback.
void Tokenizer::build_spm_byte_fallback() {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    int32_t id = find_token(name);
    if (id < 0) id = find_token(std::string(1, static_cast<char>(b)));
    byte_fallback_[b] = id;
  }
}

// The trie of special spellings, longest first (ties: lower id first).
void Tokenizer::build_special_trie() {
  const size_t n = texts_.size();
  std::vector<int32_t> specials;
  for (size_t i = 0; i < n; ++i) {
    const TokenType ty = types_[i];
    if (ty == TokenType::Control || ty == TokenType::Unknown || ty == TokenType::UserDefined) {
      specials.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(specials.begin(), specials.end(),
                   [&](int32_t a, int32_t b) { return texts_[a].size() > texts_[b].size(); });
  special_priority_.assign(n, -1);
  std::fill(std::begin(trie_root_), std::end(trie_root_), -1);
  trie_.clear();
  for (size_t rank = 0; rank < specials.size(); ++rank) {
    const int32_t id = specials[rank];
    special_priority_[id] = static_cast<int32_t>(rank);
    const std::string &text = texts_[id];
    int32_t node = -1;
    for (size_t k = 0; k < text.size(); ++k) {
      const uint8_t c = static_cast<uint8_t>(text[k]);
      int32_t *link = node < 0 ? &trie_root_[c] : &trie_[node].child;
      int32_t found = -1;
      if (node < 0) {
        found = *link;
      } else {
        for (int32_t x = *link; x >= 0; x = trie_[x].sibling) {
          if (trie_[x].byte == c) {
            found = x;
            break;
          }
        }
      }
      if (found < 0) {
        TrieNode fresh;
        fresh.byte = c;
        fresh.sibling = node < 0 ? -1 : *link;
        trie_.push_back(fresh);
        found = static_cast<int32_t>(trie_.size() - 1);
        // `link` may dangle after push_back; recompute it.
        if (node < 0)
          trie_root_[c] = found;
        else
          trie_[node].child = found;
      }
      node = found;
    }
    // The same spelling twice: the first in priority order keeps it.
    if (node >= 0 && trie_[node].token < 0) trie_[node].token = id;
  }
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "tokenizer: token id %d outside the vocabulary [0, %d)",
         id, vocab_size());
  }
}

void Tokenizer::IdTable::build(const std::vector<std::string> *keys, const std::vector<bool> &has) {
  keys_ = keys;
  size_t cap = 16;
  while (cap < keys->size() * 2) cap <<= 1;
  slots_.assign(cap, -1);
  hashes_.assign(cap, 0);
  mask_ = cap - 1;
  for (size_t i = 0; i < keys->size(); ++i) {
    if (!has[i]) continue;
    const std::string &key = (*keys)[i];
    const size_t h = std::hash<std::string_view>{}(key);
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (size_t s = h & mask_;; s = (s + 1) & mask_) {
      if (slots_[s] < 0) {
        slots_[s] = static_cast<int32_t>(i);
        hashes_[s] = tag;
        break;
      }
      if (hashes_[s] == tag && (*keys)[slots_[s]] == key) {
        slots_[s] = static_cast<int32_t>(i);  // a later id with the same key wins
        break;
      }
    }
  }
}

int32_t Tokenizer::IdTable::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const size_t h = std::hash<std::string_view>{}(key);
  const uint32_t tag = static_cast<uint32_t>(h >> 32);
  for (size_t s = h & mask_;; s = (s + 1) & mask_) {
    const int32_t id = slots_[s];
    if (id < 0) return -1;
    if (hashes_[s] == tag && (*keys_)[id] == key) return id;
  }
}

int32_t Tokenizer::lookup(std::string_view key) const {
  return kind_ == Kind::Bpe ? by_key_.find(key) : by_text_.find(key);
}

int32_t Tokenizer::find_token(std::string_view text) const {
  return by_text_.find(text);
}

const std::string &Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return texts_[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return types_[id];
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

std::string Tokenizer::token_bytes(int32_t id, bool special) const {
  check_id(id);
  if (!special && (types_[id] == TokenType::Control || types_[id] == TokenType::Unknown)) return {};
  return bytes_[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  bool strip_space = kind_ == Kind::Spm && add_space_prefix_;
  for (int32_t id : ids) {
    check_id(id);
    const std::string &piece = bytes_[id];
    const TokenType ty = types_[id];
    if (strip_space && ty != TokenType::Control) {
      // The first piece of text carries the space encode put in front.
      strip_space = false;
      if (!piece.empty() && piece[0] == ' ') {
        out.append(piece, 1, std::string::npos);
        continue;
      }
    }
    out += piece;
  }
  return out;
}

// Cuts the text at special spellings. llama.cpp's rule: take the special tokens longest first;
// each takes its leftmost non-overlapping occurrences in the text not yet taken. Here all
// occurrences are found at once with the trie and then accepted in that same order.
std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text,
                                                      bool parse_special) const {
  struct Candidate {
    int32_t priority;
    int32_t token;
    size_t begin, end;
  };
  std::vector<Candidate> candidates;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    int32_t node = trie_root_[static_cast<uint8_t>(text[i])];
    size_t k = i + 1;
    while (node >= 0) {
      const int32_t tok = trie_[node].token;
      if (tok >= 0 && (parse_special || types_[tok] == TokenType::UserDefined)) {
        candidates.push_back({special_priority_[tok], tok, i, k});
      }
      if (k >= n) break;
      const uint8_t c = static_cast<uint8_t>(text[k]);
      int32_t x = trie_[node].child;
      while (x >= 0 && trie_[x].byte != c) x = trie_[x].sibling;
      node = x;
      ++k;
    }
  }
  std::vector<Fragment> out;
  if (candidates.empty()) {
    if (n > 0) out.push_back({-1, 0, n});
    return out;
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate &a, const Candidate &b) {
    return a.priority != b.priority ? a.priority < b.priority : a.begin < b.begin;
  });
  std::map<size_t, std::pair<size_t, int32_t>> taken;  // begin -> (end, token)
  for (const Candidate &c : candidates) {
    auto it = taken.lower_bound(c.begin);
    if (it != taken.end() && it->first < c.end) continue;
    if (it != taken.begin() && std::prev(it)->second.first > c.begin) continue;
    taken.emplace(c.begin, std::make_pair(c.end, c.token));
  }
  size_t pos = 0;
  for (const auto &[begin, rest] : taken) {
    if (begin > pos) out.push_back({-1, pos, begin});
    out.push_back({rest.second, begin, rest.first});
    pos = rest.first;
  }
  if (pos < n) out.push_back({-1, pos, n});
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
  const std::vector<Fragment> fragments = partition(text, parse_special);
  if (kind_ == Kind::Bpe) {
    for (const Fragment &f : fragments) {
      if (f.token >= 0)
        out.push_back(f.token);
      else
        encode_bpe(text.substr(f.begin, f.end - f.begin), out);
    }
  } else {
    bool after_special = true;  // the start of the text counts as after a special token
    for (const Fragment &f : fragments) {
      if (f.token >= 0) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      std::string piece;
      if (add_space_prefix_ && after_special) piece = " ";
      piece.append(text.substr(f.begin, f.end - f.begin));
      encode_spm(replace_all(piece, " ", kSpmSpace), out);
      after_special = false;
    }
  }
  if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

void Tokenizer::encode_bpe(std::string_view text, std::vector<int32_t> &out) const {
  const std::string clean = unicode::sanitize_utf8(text);
  for (const auto &[begin, end] : pretok_->split(clean)) {
    encode_bpe_word(std::string_view(clean).substr(begin, end - begin), out);
  }
}

// Byte-level BPE on one word: start from single bytes and apply the lowest-ranked merge among
// adjacent pairs, leftmost first among equal ranks, until none applies. A heap of candidate pairs
// with lazy invalidation keeps this O(n log n) in the word length.
void Tokenizer::encode_bpe_word(std::string_view word, std::vector<int32_t> &out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t whole = lookup(word);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  const int32_t n = static_cast<int32_t>(word.size());
  if (n == 1) {
    const int32_t id = byte_token_[static_cast<uint8_t>(word[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  struct Pair {
    int32_t rank, left, right, left_id, right_id;
  };
  struct Later {
    bool operator()(const Pair &a, const Pair &b) const {
      return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    }
  };
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = {byte_token_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
  }
  std::vector<Pair> storage;
  storage.reserve(static_cast<size_t>(n));
  std::priority_queue<Pair, std::vector<Pair>, Later> heap(Later{}, std::move(storage));
  const auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const int32_t a = sym[l].id, b = sym[r].id;
    if (a < 0 || b < 0) return;
    auto it = merges_.find(pair_key(a, b));
    if (it == merges_.end()) return;
    heap.push({it->second.rank, l, r, a, b});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!heap.empty()) {
    const Pair p = heap.top();
    heap.pop();
    Symbol &l = sym[p.left];
    Symbol &r = sym[p.right];
    if (!l.alive || !r.alive || l.next != p.right || l.id != p.left_id || r.id != p.right_id)
      continue;
    l.id = merges_.find(pair_key(p.left_id, p.right_id))->second.result;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = p.left;
    consider(l.prev, p.left);
    consider(p.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    // A byte without a token of its own is dropped, as in llama.cpp.
    if (sym[i].id >= 0) out.push_back(sym[i].id);
  }
}

// SentencePiece-style: start from UTF-8 characters and repeatedly merge the adjacent pair whose
// concatenation is the token with the highest score (leftmost among equal scores). Pieces left
// without a token are spelt as byte tokens.
void Tokenizer::encode_spm(std::string_view text, std::vector<int32_t> &out) const {
  if (text.empty()) return;
  struct Symbol {
    int32_t prev, next;
    size_t start, len;
  };
  std::vector<Symbol> sym;
  sym.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t len =
        std::min(unicode::utf8_seq_len(static_cast<unsigned char>(text[pos])), text.size() - pos);
    const int32_t idx = static_cast<int32_t>(sym.size());
    sym.push_back({idx - 1, pos + len < text.size() ? idx + 1 : -1, pos, len});
    pos += len;
  }
  struct Bigram {
    float score;
    int32_t left, right;
    size_t size;
  };
  struct Lower {
    bool operator()(const Bigram &a, const Bigram &b) const {
      return a.score != b.score ? a.score < b.score : a.left > b.left;
    }
  };
  std::priority_queue<Bigram, std::vector<Bigram>, Lower> heap;
  const auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const size_t size = sym[l].len + sym[r].len;
    const int32_t id = find_token(text.substr(sym[l].start, size));
    if (id < 0) return;
    heap.push({scores_[id], l, r, size});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i, i + 1);
  while (!heap.empty()) {
    const Bigram b = heap.top();
    heap.pop();
    Symbol &l = sym[b.left];
    Symbol &r = sym[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.size) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    consider(l.prev, b.left);
    consider(b.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].start, sym[i].len);
    const int32_t id = find_token(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char c : piece) {
      const int32_t fb = byte_fallback_[static_cast<uint8_t>(c)];
      if (fb >= 0)
        out.push_back(fb);
      else if (unk_ >= 0)
        out.push_back(unk_);
    }
  }
}

}  // namespace specinfer::gguf
