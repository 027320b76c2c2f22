// The tokenizer of a GGUF model: text <-> token ids, compatible with llama.cpp's.
//
// Two kinds, chosen by tokenizer.ggml.model:
//  - "gpt2": byte-level BPE (Qwen2, Llama 3, GPT-2, ...). The text is cut into words by the
//    pre-tokenizer named in tokenizer.ggml.pre (PCRE2 expressions, see tokenizer_pretokenizer.h),
//    each word starts as single bytes, and the merges in tokenizer.ggml.merges apply in rank order.
//    Invalid UTF-8 in the input is replaced by U+FFFD first (as llama.cpp does).
//  - "llama": SentencePiece-style (Gemma, Llama 2). Spaces become U+2581, optionally one is put in
//    front (tokenizer.ggml.add_space_prefix), characters merge greedily by token score, and what is
//    left without a token becomes byte tokens <0xAB>.
//
// Special tokens: control (type 3) and unknown (2) tokens are recognised in the text by their
// literal spelling only when parse_special is true; user-defined tokens (4) always. As in
// llama.cpp, end-of-turn / end-of-generation / fill-in-middle spellings ("<|im_end|>", "</s>",
// "<|fim_prefix|>", ...) are made control tokens whatever type the file gives them. Longer
// spellings win over shorter ones, and each spelling takes its leftmost occurrences.
//
// Threads: a Tokenizer is immutable after construction; all methods may run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf_file.h"

namespace specinfer::gguf {

class PreTokenizer;

// Token types as stored in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

// Everything a Tokenizer is built from: what from_gguf reads from the tokenizer.ggml.* keys, or
// what a test writes by hand. Optional fields left empty get llama.cpp's defaults.
struct TokenizerSpec {
  std::string model;                // "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;                  // pre-tokenizer name (BPE only); "" = "default"
  std::vector<std::string> tokens;  // token texts, index = id
  std::vector<float> scores;        // empty or one per token (SPM merge priority)
  std::vector<int32_t> types;       // empty (all normal) or one TokenType per token
  std::vector<std::string> merges;  // BPE only: "left right", in rank order
  std::optional<int32_t> bos, eos, eot, eom, unk, pad;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

class Tokenizer {
 public:
  // Reads the tokenizer.ggml.* keys. Throws gguf::Error: FORMAT if the keys are missing or
  // inconsistent (array sizes, ids out of range, BPE without merges), UNSUPPORTED for a tokenizer
  // model other than "gpt2" and "llama".
  static std::unique_ptr<Tokenizer> from_gguf(const File &f);
  // Builds from in-memory data. Same errors as from_gguf.
  static std::unique_ptr<Tokenizer> from_spec(TokenizerSpec spec);

  ~Tokenizer();
  Tokenizer(const Tokenizer &) = delete;
  Tokenizer &operator=(const Tokenizer &) = delete;

  // Text -> ids. add_special puts BOS / EOS around the ids if the model asks for them (add_bos(),
  // add_eos()); parse_special lets control tokens written in the text ("<|im_end|>") become their
  // ids instead of being spelt out. Never fails on any byte string (throws only on out-of-memory).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes one token stands for: byte-level tokens are decoded back to raw bytes, SPM pieces
  // get spaces for U+2581, byte tokens <0xAB> give their one byte, control / user-defined / unknown
  // tokens give their spelling, unused and undefined tokens nothing. With special = false, control
  // and unknown tokens give nothing either (llama.cpp's token_to_piece(special=false)). Throws
  // gguf::Error (INVALID_ARGUMENT) for an id outside [0, vocab_size()).
  std::string token_bytes(int32_t id, bool special = true) const;

  // Concatenated token_bytes of the ids; for SPM with add_space_prefix, the space that encode put
  // in front of the text is taken off again. decode(encode(t, false, false)) == t for valid UTF-8
  // t in which no user-defined token is spelt out differently. Throws like token_bytes.
  std::string decode(std::span<const int32_t> ids) const;

  int32_t vocab_size() const { return static_cast<int32_t>(texts_.size()); }
  // Special ids; -1 when the model has none.
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  // End of turn: tokenizer.ggml.eot_token_id, else the first of <|eot_id|>, <|im_end|>,
  // <end_of_turn>, <|end|>, <|endoftext|>, ... (kEndOfTurn in tokenizer.cpp) in the vocabulary.
  int32_t eot() const { return eot_; }
  int32_t unk() const { return unk_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  // True for ids that end generation: eos, eot, eom, the well-known end-of-text spellings and the
  // fill-in-middle pad / repository / file-separator markers (llama.cpp's list).
  bool is_eog(int32_t id) const;
  // Those ids, in increasing order.
  const std::vector<int32_t> &eog() const { return eog_; }

  bool is_byte_level() const { return kind_ == Kind::Bpe; }
  // The name of the pre-tokenizer in use ("qwen2", "default", ...; "" for SPM).
  const std::string &pre_name() const { return pre_; }
  // Token text exactly as stored in the vocabulary; type as stored (with llama.cpp's corrections
  // for end-of-turn / fill-in-middle tokens, which are made control tokens). Throw like
  // token_bytes.
  const std::string &token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // The id whose stored text is `text`, or -1.
  int32_t find_token(std::string_view text) const;

 private:
  enum class Kind { Bpe, Spm };
  // A node of the special-spelling trie; children are a sibling list (the root has a table).
  struct TrieNode {
    int32_t child = -1;
    int32_t sibling = -1;
    int32_t token = -1;  // the token spelt by the path to here, or -1
    uint8_t byte = 0;
  };
  // A piece of the input: raw text [begin, end) if token < 0, else one special token.
  struct Fragment {
    int32_t token;
    size_t begin, end;
  };

  Tokenizer() = default;
  // build's steps, in order.
  void build(TokenizerSpec &spec);
  void build_vocabulary(TokenizerSpec &spec);
  void build_special_ids(const TokenizerSpec &spec);
  std::vector<bool> build_token_bytes();
  void build_bpe_merges(const std::vector<std::string> &merges, const std::vector<bool> &has_key);
  void build_spm_byte_fallback();
  void build_special_trie();
  void check_id(int32_t id) const;
  int32_t lookup(std::string_view key) const;
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
  void encode_bpe(std::string_view text, std::vector<int32_t> &out) const;
  void encode_bpe_word(std::string_view word, std::vector<int32_t> &out) const;
  void encode_spm(std::string_view text, std::vector<int32_t> &out) const;

  // String -> id, open addressing over a power-of-two table of ids; the strings stay in a
  // vector owned by the Tokenizer. Several times faster to build and probe than an
  // unordered_map<string, int> at 150k entries (one cache miss per probe instead of three).
  class IdTable {
   public:
    // Indexes keys[i] -> i for every i with has[i]; for equal keys the highest i wins.
    void build(const std::vector<std::string> *keys, const std::vector<bool> &has);
    int32_t find(std::string_view key) const;

   private:
    const std::vector<std::string> *keys_ = nullptr;
    std::vector<int32_t> slots_;    // id, or -1 for empty
    std::vector<uint32_t> hashes_;  // high bits of each slot's hash, to skip most compares
    size_t mask_ = 0;
  };

  Kind kind_ = Kind::Bpe;
  std::string pre_;
  std::vector<std::string> texts_;
  std::vector<TokenType> types_;
  std::vector<float> scores_;
  std::vector<std::string> bytes_;  // token_bytes per id
  IdTable by_text_;                 // stored text -> id (later ids win, as in llama.cpp)
  std::vector<std::string> keys_;   // BPE: raw bytes each token matches (if its text decodes)
  IdTable by_key_;                  // BPE: raw bytes -> id
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, unk_ = -1, pad_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
  std::vector<int32_t> eog_;  // sorted

  // BPE
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, merged id
  int32_t byte_token_[256];                     // id of each single raw byte, or -1
  bool ignore_merges_ = false;                  // whole words that are tokens skip the merges
  std::unique_ptr<PreTokenizer> pretok_;

  // SPM
  int32_t byte_fallback_[256];  // <0xAB> token of each byte, or -1

  // Special spellings: a byte trie over the texts of control / unknown / user-defined tokens.
  std::vector<TrieNode> trie_;
  int32_t trie_root_[256];
  std::vector<int32_t> special_priority_;  // per id: rank by (length desc, id asc), or -1
};

}  // namespace specinfer::gguf
