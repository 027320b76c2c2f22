// White-box tests of the GGUF tokenizer.
//
// Part 1, tiny hand-built vocabularies: merge order, the GPT-2 byte map, the pre-tokenizer
// expressions (expected pieces produced with Hugging Face tokenizers' Split pre-tokenizer on the
// same expressions), special-token splitting, SentencePiece merges by score and byte fallback,
// reading from a GGUF file and the errors for bad ones.
// Part 2, real models in $SPECINFER_MODELS (default ~/.cache/specinfer/models): every text of
// tests/data/reference/tokenizer_<model>.json (written by llama.cpp, see scripts/make-reference.py)
// must encode to exactly the reference ids in all three settings, every sampled id must give the
// reference bytes, and decode(encode(text)) must give the text back. A model that is absent is
// skipped with a message.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/gguf/gguf_writer.h"
#include "gguf/gguf_file.h"
#include "gguf/tokenizer.h"
#include "gguf/tokenizer_pretokenizer.h"
#include "gguf/unicode.h"

#include <stdint.h>

#include "support/cmocka_setup.h"
#include "support/models.h"

using specinfer::gguf::Error;
using specinfer::gguf::File;
using specinfer::gguf::PreTokenizer;
using specinfer::gguf::Tokenizer;
using specinfer::gguf::TokenizerSpec;
using specinfer::gguf::TokenType;
namespace unicode = specinfer::gguf::unicode;

namespace {

using Ids = std::vector<int32_t>;

// The status code a call throws, or -1 if it returns.
template <typename F>
int error_code(F &&f) {
  try {
    f();
  } catch (const Error &e) {
    return static_cast<int>(e.code());
  }
  return -1;
}

std::string ids_str(const Ids &ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

void expect_ids(const Ids &got, const Ids &want, const char *what) {
  if (got != want) {
    print_error("%s: got %s, want %s\n", what, ids_str(got).c_str(), ids_str(want).c_str());
    fail();
  }
}

// A byte-level vocabulary: ids 0..255 are the single bytes in byte order (spelt with the GPT-2
// map), then `extra` (raw bytes, normal tokens unless a type is given), merges as raw pairs.
struct ByteLevelVocab {
  TokenizerSpec spec;
  int32_t add(const std::string &raw, TokenType type = TokenType::Normal) {
    const bool spelt = type == TokenType::Normal;
    spec.tokens.push_back(spelt ? unicode::bytes_to_byte_level(raw) : raw);
    spec.types.push_back(static_cast<int32_t>(type));
    return static_cast<int32_t>(spec.tokens.size() - 1);
  }
  void merge(const std::string &l, const std::string &r) {
    spec.merges.push_back(unicode::bytes_to_byte_level(l) + " " + unicode::bytes_to_byte_level(r));
  }
  explicit ByteLevelVocab(const std::string &pre) {
    spec.model = "gpt2";
    spec.pre = pre;
    for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  }
};

// ---------------------------------------------------------------------------------------------
// Part 1: tiny vocabularies

void test_byte_map(void **) {
  assert_string_equal(unicode::bytes_to_byte_level(" ").c_str(), "\xC4\xA0");   // U+0120 'Ġ'
  assert_string_equal(unicode::bytes_to_byte_level("\n").c_str(), "\xC4\x8A");  // U+010A 'Ċ'
  assert_string_equal(unicode::bytes_to_byte_level("A~").c_str(), "A~");
  assert_string_equal(unicode::bytes_to_byte_level("\xFF").c_str(), "\xC3\xBF");  // 'ÿ' stays
  assert_string_equal(unicode::bytes_to_byte_level(std::string(1, '\0')).c_str(),
                      "\xC4\x80");  // U+0100
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  auto back = unicode::byte_level_to_bytes(unicode::bytes_to_byte_level(all));
  assert_true(back.has_value());
  assert_true(*back == all);
  assert_false(
      unicode::byte_level_to_bytes("\xE4\xBD\xA0").has_value());   // '你' stands for no byte
  assert_false(unicode::byte_level_to_bytes("\xC4").has_value());  // truncated

  bool changed = false;
  assert_string_equal(unicode::sanitize_utf8("ok \xC3\xA9", &changed).c_str(), "ok \xC3\xA9");
  assert_false(changed);
  assert_string_equal(unicode::sanitize_utf8("a\xFF"
                                             "b\xE2\x82",
                                             &changed)
                          .c_str(),
                      "a\xEF\xBF\xBD"
                      "b\xEF\xBF\xBD\xEF\xBF\xBD");
  assert_true(changed);
  assert_string_equal(unicode::sanitize_utf8("\xED\xA0\x80").c_str(),
                      "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

void test_bpe_merge_order(void **) {
  {  // "b c" ranks before "a b": abc -> a + bc, and "a bc" is no merge
    ByteLevelVocab v("gpt2");
    const int32_t bc = v.add("bc");
    v.add("ab");
    v.add("abc");
    v.merge("b", "c");
    v.merge("a", "b");
    v.merge("ab", "c");
    auto t = Tokenizer::from_spec(v.spec);
    expect_ids(t->encode("abc", false, false), {'a', bc}, "b c first");
  }
  {  // "a b" first: abc -> ab + c -> abc
    ByteLevelVocab v("gpt2");
    const int32_t bc = v.add("bc");
    v.add("ab");
    const int32_t abc = v.add("abc");
    v.merge("a", "b");
    v.merge("b", "c");
    v.merge("ab", "c");
    auto t = Tokenizer::from_spec(v.spec);
    expect_ids(t->encode("abc", false, false), {abc}, "a b first");
    expect_ids(t->encode("abcbc", false, false), {abc, bc}, "then bc");
  }
  {  // equal ranks: the leftmost pair merges first
    ByteLevelVocab v("gpt2");
    const int32_t aa = v.add("aa");
    v.merge("a", "a");
    auto t = Tokenizer::from_spec(v.spec);
    expect_ids(t->encode("aaa", false, false), {aa, 'a'}, "leftmost");
    expect_ids(t->encode("aaaa", false, false), {aa, aa}, "two pairs");
  }
  {  // merges never cross pre-tokenizer words; spaces are bytes too
    ByteLevelVocab v("gpt2");
    const int32_t sp_a = v.add(" a");
    const int32_t ab = v.add("ab");
    v.merge(" ", "a");
    v.merge("a", "b");
    auto t = Tokenizer::from_spec(v.spec);
    expect_ids(t->encode("ab ab", false, false), {ab, sp_a, 'b'}, "word boundary");
    assert_string_equal(t->token_bytes(sp_a).c_str(), " a");
  }
}

void test_bpe_bytes(void **) {
  ByteLevelVocab v("qwen2");
  auto t = Tokenizer::from_spec(v.spec);
  assert_true(t->is_byte_level());
  expect_ids(t->encode("\xC3\xA9", false, false), {0xC3, 0xA9}, "two-byte char");
  expect_ids(t->encode(" \n", false, false), {' ', '\n'}, "whitespace bytes");
  // Invalid UTF-8 becomes U+FFFD before the merges, as in llama.cpp.
  expect_ids(t->encode("\xFF", false, false), {0xEF, 0xBF, 0xBD}, "invalid byte");
  assert_string_equal(t->token_bytes(' ').c_str(), " ");
  assert_string_equal(t->token_bytes(0xA9).c_str(), "\xA9");
  const std::string text = "Grüße, 世界! \t\r\n 🦙 x";
  const Ids ids = t->encode(text, false, false);
  assert_int_equal(ids.size(), text.size());
  assert_true(t->decode(ids) == text);
  assert_int_equal(error_code([&] { t->token_bytes(-1); }), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(error_code([&] { t->token_bytes(t->vocab_size()); }),
                   SPECINFER_ERR_INVALID_ARGUMENT);
}

std::vector<std::string> pieces(const PreTokenizer &p, const std::string &text) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (const auto &[b, e] : p.split(text)) {
    assert_int_equal(b, pos);  // pieces cover the text in order
    out.push_back(text.substr(b, e - b));
    pos = e;
  }
  assert_int_equal(pos, text.size());
  return out;
}

void expect_pieces(const char *pre, const std::string &text, const std::vector<std::string> &want) {
  bool known = false;
  PreTokenizer p(PreTokenizer::patterns_for(pre, &known));
  assert_true(known);
  const auto got = pieces(p, text);
  if (got != want) {
    std::string g;
    for (const auto &s : got) g += "[" + s + "]";
    print_error("pre-tokenizer %s: got %s\n", pre, g.c_str());
    fail();
  }
}

void test_pretokenizers(void **) {
  const std::string t1 = "Hello  world12345 it's\n\n  x";
  const std::string t2 = "  if (a<=b) {\r\n\treturn;}  ";
  const std::string t3 = "na\xC3\xAFve caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD x\xC2\xB2";
  expect_pieces("qwen2", t1,
                {"Hello", " ", " world", "1", "2", "3", "4", "5", " it", "'s", "\n\n", " ", " x"});
  expect_pieces("qwen2", t2,
                {" ", " if", " (", "a", "<=", "b", ")", " {\r\n", "\treturn", ";}", "  "});
  expect_pieces("qwen2", t3,
                {"na\xC3\xAFve", " caf\xC3\xA9", " \xE4\xBD\xA0\xE5\xA5\xBD", " x", "\xC2\xB2"});
  expect_pieces("llama-bpe", t1,
                {"Hello", " ", " world", "123", "45", " it", "'s", "\n\n", " ", " x"});
  expect_pieces("llama3", t2,
                {" ", " if", " (", "a", "<=", "b", ")", " {\r\n", "\treturn", ";}", "  "});
  expect_pieces("gpt2", t1, {"Hello", " ", " world", "12345", " it", "'s", "\n\n ", " x"});
  expect_pieces("gpt2", t2,
                {" ", " if", " (", "a", "<=", "b", ")", " {", "\r\n", "\t", "return", ";}", "  "});
  // Contractions in either case; U+017F (long s) is not an 's'.
  expect_pieces("qwen2", "IT'S it'\xC5\xBF", {"IT", "'S", " it", "'\xC5\xBF"});
  bool known = true;
  PreTokenizer::patterns_for("no-such-pre", &known);
  assert_false(known);
  PreTokenizer def(PreTokenizer::patterns_for("default", &known));
  assert_true(known);
  assert_true(pieces(def, "x = 1234;").size() >= 4);
  // A malformed expression is an error, not a crash.
  assert_int_equal(error_code([] { PreTokenizer bad({"(unclosed"}); }), SPECINFER_ERR_INTERNAL);
}

void test_special_tokens(void **) {
  ByteLevelVocab v("qwen2");
  const int32_t end = v.add("<|sep|>", TokenType::Control);
  const int32_t e_short = v.add("<|s", TokenType::Control);
  const int32_t tool = v.add("<tool>", TokenType::UserDefined);
  const int32_t bos = v.add("<s>", TokenType::Control);
  const int32_t eos = v.add("</s>", TokenType::Control);
  const int32_t im_end = v.add("<|im_end|>", TokenType::UserDefined);  // made control by name
  v.spec.bos = bos;
  v.spec.eos = eos;
  v.spec.add_bos = true;
  v.spec.add_eos = true;
  auto t = Tokenizer::from_spec(v.spec);
  assert_int_equal(t->token_type(im_end), static_cast<int>(TokenType::Control));
  assert_int_equal(t->eot(), im_end);
  assert_true(t->is_eog(im_end));
  assert_true(t->is_eog(eos));
  assert_false(t->is_eog(end));
  assert_int_equal(t->bos(), bos);
  assert_int_equal(t->eos(), eos);

  expect_ids(t->encode("x<|sep|>y", false, true), {'x', end, 'y'}, "control parsed");
  // The longer spelling wins over its prefix; the prefix still matches where it stands alone.
  expect_ids(t->encode("<|s<|sep|>", false, true), {e_short, end}, "longest first");
  // Without parse_special, control spellings stay text; user-defined ones are always tokens.
  const Ids plain = t->encode("x<|sep|><tool>", false, false);
  assert_int_equal(plain.size(), 1 + 7 + 1);
  assert_int_equal(plain.back(), tool);
  assert_true(t->decode(plain) == "x<|sep|><tool>");
  expect_ids(t->encode("x", true, false), {bos, 'x', eos}, "bos/eos");
  expect_ids(t->encode("", true, false), {bos, eos}, "empty with specials");
  expect_ids(t->encode("", false, true), {}, "empty");
  // Control pieces are spelt with special = true, empty without.
  assert_string_equal(t->token_bytes(end).c_str(), "<|sep|>");
  assert_string_equal(t->token_bytes(end, false).c_str(), "");
  assert_string_equal(t->token_bytes(tool, false).c_str(), "<tool>");
  const std::string chat = "<s>a<|sep|>\n<tool>b</s>";
  assert_true(t->decode(t->encode(chat, false, true)) == chat);
}

// llama.cpp's loader retypes tokens by spelling whatever the file says: end-of-generation and
// fill-in-middle spellings become control tokens (even "</s>", a normal token in Qwen2.5's
// vocabulary), the gpt-oss channel markers user-defined; with Gemma 4's "<|tool_response>",
// "</s>" stays normal, and with gpt-oss's "<|return|>" and "<|call|>", "<|end|>" is user-defined.
void test_control_by_name(void **) {
  {
    ByteLevelVocab v("qwen2");
    const int32_t s_end = v.add("</s>");
    const int32_t file_sep = v.add("<|file_sep|>");
    const int32_t channel = v.add("<|channel|>", TokenType::Control);
    auto t = Tokenizer::from_spec(v.spec);
    assert_int_equal(t->token_type(s_end), static_cast<int>(TokenType::Control));
    assert_int_equal(t->token_type(file_sep), static_cast<int>(TokenType::Control));
    assert_int_equal(t->token_type(channel), static_cast<int>(TokenType::UserDefined));
    assert_true(t->is_eog(s_end));
    assert_true(t->is_eog(file_sep));
    assert_false(t->is_eog(channel));
    assert_string_equal(t->token_bytes(s_end).c_str(), "</s>");
    assert_string_equal(t->token_bytes(s_end, false).c_str(), "");
    assert_string_equal(t->token_bytes(channel, false).c_str(), "<|channel|>");
    expect_ids(t->encode("a</s>", false, true), {'a', s_end}, "</s> parsed as control");
    expect_ids(t->encode("a</s>", false, false), {'a', '<', '/', 's', '>'}, "</s> as text");
    expect_ids(t->encode("a<|channel|>", false, false), {'a', channel},
               "user-defined always parsed");
  }
  {
    ByteLevelVocab v("qwen2");
    const int32_t s_end = v.add("</s>");
    const int32_t tool_response = v.add("<|tool_response>", TokenType::Control);
    const int32_t end = v.add("<|end|>", TokenType::Control);
    v.add("<|return|>", TokenType::Control);
    v.add("<|call|>", TokenType::Control);
    auto t = Tokenizer::from_spec(v.spec);
    assert_int_equal(t->token_type(s_end), static_cast<int>(TokenType::Normal));
    assert_false(t->is_eog(s_end));
    assert_true(t->is_eog(tool_response));
    assert_int_equal(t->token_type(end), static_cast<int>(TokenType::UserDefined));
    assert_false(t->is_eog(end));
    assert_string_equal(t->token_bytes(s_end, false).c_str(), "</s>");
    expect_ids(t->encode("</s>", false, true), {'<', '/', 's', '>'}, "normal </s> is text");
  }
}

// A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens (ids 3..258), then pieces.
struct SpmVocab {
  TokenizerSpec spec;
  int32_t add(const std::string &text, float score, TokenType type = TokenType::Normal) {
    spec.tokens.push_back(text);
    spec.scores.push_back(score);
    spec.types.push_back(static_cast<int32_t>(type));
    return static_cast<int32_t>(spec.tokens.size() - 1);
  }
  SpmVocab() {
    spec.model = "llama";
    add("<unk>", 0, TokenType::Unknown);
    add("<s>", 0, TokenType::Control);
    add("</s>", 0, TokenType::Control);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      add(name, 0, TokenType::Byte);
    }
  }
};

const std::string kSp = "\xE2\x96\x81";  // U+2581

void test_spm(void **) {
  for (int ab_first = 0; ab_first < 2; ++ab_first) {
    SpmVocab v;
    const int32_t sp = v.add(kSp, -5);
    const int32_t a = v.add("a", -3);
    const int32_t b = v.add("b", -3);
    const int32_t ab = v.add("ab", ab_first ? -1.0f : -2.5f);
    const int32_t sp_a = v.add(kSp + "a", -2);
    auto t = Tokenizer::from_spec(v.spec);
    assert_false(t->is_byte_level());
    assert_true(t->add_space_prefix());  // llama.cpp's default for SPM
    // "ab" -> "▁ab": the higher-scoring of "▁a" / "ab" merges first.
    if (ab_first)
      expect_ids(t->encode("ab", false, false), {sp, ab}, "ab first");
    else
      expect_ids(t->encode("ab", false, false), {sp_a, b}, "sp a first");
    (void)a;
  }
  SpmVocab v;
  const int32_t sp = v.add(kSp, -5);
  v.add("a", -3);
  v.add("b", -3);
  const int32_t sp_ab = v.add(kSp + "ab", -0.5f);
  v.add(kSp + "a", -2);
  v.add("ab", -1);
  const int32_t turn = v.add("<turn>", 0, TokenType::Control);
  v.spec.add_space_prefix = false;
  auto t = Tokenizer::from_spec(v.spec);
  assert_int_equal(t->bos(), 1);
  assert_int_equal(t->eos(), 2);
  assert_true(t->add_bos());
  expect_ids(t->encode(" ab", true, false), {1, sp_ab}, "bos + merged");
  // Byte fallback: 'é' has no piece, so its two UTF-8 bytes become <0xC3> <0xA9>.
  expect_ids(t->encode(" \xC3\xA9", false, false), {sp, 3 + 0xC3, 3 + 0xA9}, "byte fallback");
  assert_string_equal(t->token_bytes(sp_ab).c_str(), " ab");
  assert_string_equal(t->token_bytes(3 + 'A').c_str(), "A");
  assert_int_equal(t->token_bytes(3).size(), 1);  // <0x00> is one zero byte
  expect_ids(t->encode(" ab<turn> ab", false, true), {sp_ab, turn, sp_ab}, "special in SPM");
  for (const std::string text : {" ab ab", "x\xC3\xA9\xE4\xBD\xA0\n\t!", "", "a  b", "\xFF\xFE"}) {
    assert_true(t->decode(t->encode(text, false, false)) ==
                text);  // bytes survive, even invalid UTF-8
  }

  // With add_space_prefix, "ab" is encoded as "▁ab" and decode takes the space off again.
  v.spec.add_space_prefix = true;
  auto t2 = Tokenizer::from_spec(v.spec);
  expect_ids(t2->encode("ab", false, false), {sp_ab}, "space prefix");
  assert_true(t2->decode(t2->encode("ab ab", true, false)) == "<s>ab ab");
}

void test_long_inputs(void **) {
  ByteLevelVocab v("qwen2");
  const int32_t aa = v.add("aa");
  const int32_t a4 = v.add("aaaa");
  v.merge("a", "a");
  v.merge("aa", "aa");
  auto t = Tokenizer::from_spec(v.spec);
  const Ids ids = t->encode(std::string(100000, 'a'), false, false);
  assert_int_equal(ids.size(), 25000);
  assert_true(std::all_of(ids.begin(), ids.end(), [&](int32_t id) { return id == a4; }));
  expect_ids(t->encode("aaaaaa", false, false), {a4, aa}, "six");
  // Long runs of whitespace and of one symbol go through the matcher in one piece each.
  const std::string blanks =
      std::string(50000, ' ') + "x" + std::string(50000, '\n') + std::string(20000, '{');
  const Ids b = t->encode(blanks, false, false);
  assert_int_equal(b.size(), blanks.size());
  assert_true(t->decode(b) == blanks);
}

void test_from_gguf(void **) {
  const auto make = [](bool with_model, const char *model, bool with_merges, size_t n_scores) {
    gguf_test::Writer w;
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b)
      tokens.push_back(unicode::bytes_to_byte_level(std::string(1, char(b))));
    tokens.push_back("ab");
    tokens.push_back("<|im_end|>");
    std::vector<int32_t> types(tokens.size(), 1);
    types.back() = 3;
    if (with_model) w.kv_str("tokenizer.ggml.model", model);
    w.kv_str("tokenizer.ggml.pre", "qwen2");
    w.kv_str_array("tokenizer.ggml.tokens", tokens);
    w.kv_array("tokenizer.ggml.token_type", gguf_test::T_I32, types);
    if (n_scores)
      w.kv_array("tokenizer.ggml.scores", gguf_test::T_F32, std::vector<float>(n_scores, 0.0f));
    if (with_merges) w.kv_str_array("tokenizer.ggml.merges", {"a b"});
    w.kv_u32("tokenizer.ggml.eos_token_id", 257);
    w.kv_u32("tokenizer.ggml.bos_token_id", 999999);  // out of range: ignored
    w.kv_bool("tokenizer.ggml.add_bos_token", false);
    const std::vector<uint8_t> bytes = w.build();
    return File::from_memory(bytes.data(), bytes.size());
  };
  auto good = make(true, "gpt2", true, 258);
  auto t = Tokenizer::from_gguf(*good);
  assert_int_equal(t->vocab_size(), 258);
  assert_int_equal(t->eos(), 257);
  assert_int_equal(t->bos(), -1);
  assert_int_equal(t->eot(), 257);
  assert_false(t->add_bos());
  assert_string_equal(t->pre_name().c_str(), "qwen2");
  expect_ids(t->encode("ab<|im_end|>", true, true), {256, 257}, "from gguf");
  assert_int_equal(t->find_token("ab"), 256);
  assert_int_equal(t->find_token("nope"), -1);

  auto no_model = make(false, "", true, 0);
  assert_int_equal(error_code([&] { Tokenizer::from_gguf(*no_model); }), SPECINFER_ERR_FORMAT);
  auto bert = make(true, "bert", true, 0);
  assert_int_equal(error_code([&] { Tokenizer::from_gguf(*bert); }), SPECINFER_ERR_UNSUPPORTED);
  auto no_merges = make(true, "gpt2", false, 0);
  assert_int_equal(error_code([&] { Tokenizer::from_gguf(*no_merges); }), SPECINFER_ERR_FORMAT);
  auto bad_scores = make(true, "gpt2", true, 7);
  assert_int_equal(error_code([&] { Tokenizer::from_gguf(*bad_scores); }), SPECINFER_ERR_FORMAT);
  TokenizerSpec empty;
  empty.model = "llama";
  assert_int_equal(error_code([&] { Tokenizer::from_spec(empty); }), SPECINFER_ERR_FORMAT);
}

// ---------------------------------------------------------------------------------------------
// Part 2: real models against llama.cpp's reference

std::string base64_decode(const std::string &in) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '+')
      v = 62;
    else if (c == '/')
      v = 63;
    else
      continue;  // '=' padding
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

std::string data_dir() {
  const char *d = std::getenv("SPECINFER_TEST_DATA");
  return d ? d : "tests/data";
}

bool read_file(const std::string &path, std::string &out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

// A reference file as JSON; a malformed one fails the test with nlohmann-json's message, which
// says where.
nlohmann::json parse_reference(const std::string &path, const std::string &text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error &e) {
    print_error("%s: %s\n", path.c_str(), e.what());
    fail();
  }
  return nullptr;
}

struct RealModel {
  const char *name;
  Ids hello_world;  // "Hello world", add_special = false (independently known ids)
};

// Texts for the round trip beyond the reference set.
const char *kRoundTrip[] = {
    "Hello world",
    "def f(x):\n\treturn x**2  # square\n\n\n",
    "  \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C "
    "\xF0\x9F\xA6\x99\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
    "e\xCC\x81 \xC2\xA0nbsp \xE3\x80\x80 ideographic 12345678901234567890",
    "<|im_start|>user\nhi<|im_end|><start_of_turn>model\n",
};

// The checks of test_real_models; returns how many models were present.
int check_real_models() {
  const RealModel models[] = {
      {"qwen2.5-coder-1.5b", {9707, 1879}},
      {"qwen2.5-coder-0.5b", {9707, 1879}},
      {"gemma-3-270m", {9259, 1902}},
  };
  int n_models = 0;
  for (const RealModel &m : models) {
    const std::string path = std::string(models_dir()) + "/" + m.name + ".gguf";
    if (!std::ifstream(path)) {
      std::printf("[  SKIP    ] %s: %s not present (scripts/fetch-models fetches it)\n", m.name,
                  path.c_str());
      continue;
    }
    ++n_models;
    auto file = File::open(path);
    auto t = Tokenizer::from_gguf(*file);
    expect_ids(t->encode("Hello world", false, false), m.hello_world, m.name);
    for (const char *text : kRoundTrip) {
      const Ids ids = t->encode(text, false, true);
      if (t->decode(ids) != text) {
        print_error("%s: round trip of \"%s\" fails\n", m.name, text);
        fail();
      }
    }

    const std::string ref_path = data_dir() + "/reference/tokenizer_" + m.name + ".json";
    std::string ref_text;
    if (!read_file(ref_path, ref_text)) {
      std::printf("[  SKIP    ] %s: no reference %s\n", m.name, ref_path.c_str());
      continue;
    }
    const nlohmann::json ref = parse_reference(ref_path, ref_text);
    assert_true(ref.is_object());
    if (ref.contains("n_vocab")) assert_int_equal(ref["n_vocab"].get<int>(), t->vocab_size());
    if (ref.contains("bos_id")) assert_int_equal(ref["bos_id"].get<int>(), t->bos());
    if (ref.contains("eos_id")) assert_int_equal(ref["eos_id"].get<int>(), t->eos());
    assert_true(ref.contains("cases") && ref["cases"].is_array());
    const nlohmann::json &cases = ref["cases"];
    int n_checks = 0, n_ok = 0, n_roundtrip = 0;
    size_t n_ids = 0;
    for (const nlohmann::json &c : cases) {
      assert_true(c.contains("text") && c["text"].is_string());
      const std::string &text = c["text"].get_ref<const std::string &>();
      const struct {
        const char *key;
        bool add_special, parse_special;
      } settings[] = {{"ids", false, true},
                      {"ids_add_special", true, true},
                      {"ids_no_parse_special", false, false}};
      for (const auto &s : settings) {
        if (!c.contains(s.key)) continue;
        const Ids want = c[s.key].get<Ids>();
        const Ids got = t->encode(text, s.add_special, s.parse_special);
        ++n_checks;
        n_ids += want.size();
        if (got == want) {
          ++n_ok;
        } else {
          print_error("%s [%s] \"%s\":\n  got  %s\n  want %s\n", m.name, s.key, text.c_str(),
                      ids_str(got).c_str(), ids_str(want).c_str());
        }
      }
      if (t->decode(t->encode(text, false, true)) == text) {
        ++n_roundtrip;
      } else {
        print_error("%s: round trip of \"%s\" fails\n", m.name, text.c_str());
      }
    }
    int n_pieces = 0, n_pieces_ok = 0;
    if (ref.contains("pieces")) {
      for (const nlohmann::json &p : ref["pieces"]) {
        if (p.size() < 2) continue;
        const int32_t id = p[0].get<int32_t>();
        ++n_pieces;
        const std::string want = base64_decode(p[1].get<std::string>());
        const std::string want_plain = p.size() > 2 ? base64_decode(p[2].get<std::string>()) : want;
        if (t->token_bytes(id) == want && t->token_bytes(id, false) == want_plain) {
          ++n_pieces_ok;
        } else if (n_pieces - n_pieces_ok <= 10) {
          print_error("%s: token %d gives \"%s\" / \"%s\", want \"%s\" / \"%s\"\n", m.name, id,
                      t->token_bytes(id).c_str(), t->token_bytes(id, false).c_str(), want.c_str(),
                      want_plain.c_str());
        }
      }
    }
    std::printf(
        "[  INFO    ] %s: %d/%d encodings match llama.cpp (%zu ids), %d/%zu round trips, %d/%d "
        "pieces\n",
        m.name, n_ok, n_checks, n_ids, n_roundtrip, cases.size(), n_pieces_ok, n_pieces);
    assert_true(n_checks > 0);
    assert_int_equal(n_ok, n_checks);
    assert_int_equal(static_cast<size_t>(n_roundtrip), cases.size());
    assert_int_equal(n_pieces_ok, n_pieces);
  }
  return n_models;
}

// cmocka's skip() leaves by longjmp, so it is called here, where nothing with a destructor is
// alive (the model table above holds vectors that would leak under LeakSanitizer).
void test_real_models(void **) {
  if (check_real_models() == 0) skip();
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_byte_map),
      cmocka_unit_test(test_bpe_merge_order),
      cmocka_unit_test(test_bpe_bytes),
      cmocka_unit_test(test_pretokenizers),
      cmocka_unit_test(test_special_tokens),
      cmocka_unit_test(test_control_by_name),
      cmocka_unit_test(test_spm),
      cmocka_unit_test(test_long_inputs),
      cmocka_unit_test(test_from_gguf),
      cmocka_unit_test(test_real_models),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
