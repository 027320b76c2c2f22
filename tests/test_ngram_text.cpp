// Prompt lookup on the text (plugins/ngram/text_lookup.h, the ngram drafter's text=1):
//  - on a byte-level tokenizer (a token per byte): the longest earlier suffix is found, what
//    followed it is drafted, a continuation cut short loses its last token and never splits a
//    UTF-8 character, matches shorter than min_bytes draft nothing, the text follows a context
//    that changes;
//  - on Qwen2.5-Coder 0.5B's tokenizer: a value copied into JSON after a quote, whose tokens no
//    n-gram of the prompt's prose holds, is drafted from the prose;
//  - the drafter: ngram:text=1 opens, text_min is checked, and with a JSON schema its greedy
//    output on an extraction prompt equals plain decoding's, with drafts kept (release builds
//    only: not with SPECINFER_SANITIZED=1).
// The model parts skip (with a message) without the model.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "api/handles.h"
#include "ngram/text_lookup.h"
#include "specinfer.h"
#include "support/cmocka_setup.h"
#include "support/models.h"
#include "support/real_sessions.h"
#include "support/same_tokens.h"

namespace {

using specinfer_ngram::TextLookup;

// A target whose tokens are bytes: token i spells byte i. The last text it tokenized is kept.
std::string g_tokenized;

specinfer_status byte_tokenize(void *, const char *text, size_t len, int32_t, int32_t,
                               int32_t *tokens, size_t cap, size_t *n, specinfer_plugin_error *) {
  g_tokenized.assign(text, len);
  *n = len;
  if (len > cap) return SPECINFER_ERR_BUFFER_TOO_SMALL;
  for (size_t i = 0; i < len; ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return SPECINFER_OK;
}

specinfer_status byte_token_bytes(void *, int32_t token, char *buf, size_t cap, size_t *n,
                                  specinfer_plugin_error *) {
  *n = 1;
  if (cap < 1) return SPECINFER_ERR_BUFFER_TOO_SMALL;
  buf[0] = static_cast<char>(token);
  return SPECINFER_OK;
}

specinfer_target_vtable byte_vtable() {
  specinfer_target_vtable vt{};
  vt.struct_size = sizeof vt;
  vt.tokenize = byte_tokenize;
  vt.token_bytes = byte_token_bytes;
  return vt;
}

std::vector<int32_t> bytes(const std::string &s) {
  std::vector<int32_t> t;
  for (unsigned char c : s) t.push_back(c);
  return t;
}

// The text of what `look` drafts, `want` tokens at most below `vocab`, after the bytes of text.
std::string drafted(TextLookup &look, const std::string &text, int32_t want, int32_t vocab = 256) {
  const std::vector<int32_t> ctx = bytes(text);
  look.sync(ctx.data(), ctx.size());
  std::vector<int32_t> out;
  look.draft(want, vocab, out);
  std::string s;
  for (int32_t c : out) s.push_back(static_cast<char>(c));
  return s;
}

void test_byte_tokens(void **) {
  const specinfer_target_vtable vt = byte_vtable();
  TextLookup look;
  look.configure(specinfer_host_target{nullptr, &vt, nullptr}, 4);
  // The longest earlier suffix is " Northwind" (not the later "wind"): what followed it is
  // drafted, `want` tokens of it; up to the end of the text.
  assert_string_equal(
      drafted(look, "from Northwind Office Supply; a wind; name: Northwind", 8).c_str(),
      " Office ");
  assert_string_equal(drafted(look, "say hello world. then hello", 16).c_str(), " world. then hel");
  // Shorter than min_bytes: no draft; and an id at or past the vocabulary ends the draft.
  assert_string_equal(drafted(look, "abc xyz abc", 8).c_str(), "");
  assert_string_equal(drafted(look, "hello world; hello", 8, 'w').c_str(), " ");
  // A cut never splits a UTF-8 character: room for 12 bytes would end inside the "é".
  assert_string_equal(drafted(look, "key: abcdefghijk\xc3\xa9xyz; key: ", 1).c_str(), "a");
  assert_string_equal(g_tokenized.c_str(), "abcdefghijk");
  // The text follows the context: a context that extends it is appended, another starts over.
  assert_string_equal(drafted(look, "one two three one two", 4).c_str(), " thr");
  assert_string_equal(drafted(look, "one two three one two three four; one two three", 6).c_str(),
                      " four;");
  assert_string_equal(drafted(look, "red green blue red green", 32).c_str(), " blue red green");
}

// The 0.5B's tokenizer: the prose holds " Northwind" and " Office"; JSON has "North" after a quote.
void test_json_value_from_prose(void **) {
  char path[4096];
  if (!model_path("qwen2.5-coder-0.5b.gguf", path, sizeof path)) {
    std::fprintf(stderr, "SKIP: %s not found (run scripts/fetch-models)\n", path);
    skip();
  }
  RealTarget e;
  assert_true(e.open(path));
  const auto tokenize = [&](const std::string &s) {
    std::vector<int32_t> t(s.size() + 8);
    size_t n = 0;
    assert_int_equal(
        specinfer_target_tokenize(e.target, s.data(), s.size(), 0, 1, t.data(), t.size(), &n),
        SPECINFER_OK);
    t.resize(n);
    return t;
  };
  const std::string prose =
      "Invoice INV-2024-0317 from Northwind Office Supply (Germany), issued 3 March.";
  std::vector<int32_t> ctx = tokenize(prose + "\n{\"vendor\":{\"name\":\"");
  const std::vector<int32_t> north = tokenize("North");
  ctx.insert(ctx.end(), north.begin(), north.end());
  auto *t = static_cast<specinfer::TargetObject *>(e.target);
  TextLookup look;
  look.configure(specinfer_host_target{t->self(), t->vtable(), nullptr}, 5);
  look.sync(ctx.data(), ctx.size());
  std::vector<int32_t> out;
  look.draft(4, t->info().vocab_size, out);
  const std::vector<int32_t> want = tokenize("wind Office Supply (Germany");
  std::string got;
  for (int32_t id : out) got += t->token_bytes(id);
  std::fprintf(stderr, "drafted after \"North: '%s'\n", got.c_str());
  assert_true(out.size() == 4);
  assert_true(std::equal(out.begin(), out.end(), want.begin()));
  e.close();
}

const char *const kSchema =
    R"({"type":"object","properties":{"invoice_number":{"type":"string"},)"
    R"("vendor":{"type":"string"},"country":{"type":"string"},"total":{"type":"number"}},)"
    R"("required":["invoice_number","vendor","country","total"],"additionalProperties":false,)"
    R"("x-guidance":{"whitespace_flexible":false}})";
const char *const kExtract =
    "<|im_start|>user\nExtract the following as JSON.\n\nInvoice INV-2024-0317 from Northwind "
    "Office Supply (Germany), issued 3 March. The total of 1598.00 EUR is due within 30 "
    "days.<|im_end|>\n<|im_start|>assistant\n";

void test_drafter_json_equals_plain(void **) {
  if (const char *san = std::getenv("SPECINFER_SANITIZED"); san && std::strcmp(san, "1") == 0) {
    // Two generations of the 0.5B are long under the sanitizers; the lookup's own memory use
    // runs in the tests above there.
    std::fprintf(stderr, "SKIP: release builds only (SPECINFER_SANITIZED=1)\n");
    skip();
  }
  char path[4096];
  if (!model_path("qwen2.5-coder-0.5b.gguf", path, sizeof path)) {
    std::fprintf(stderr, "SKIP: %s not found (run scripts/fetch-models)\n", path);
    skip();
  }
  RealTarget e;
  assert_true(e.open(path));
  char *err = nullptr;
  specinfer_drafter *bad = nullptr;
  assert_int_equal(
      specinfer_drafter_open(e.reg, "ngram", "text=1,text_min=0", e.target, &bad, &err),
      SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err, "text_min"));
  specinfer_free(err);
  err = nullptr;
  specinfer_constraint *c = nullptr;
  if (specinfer_constraint_open(e.reg, "llguidance", nullptr, e.target, "json_schema", kSchema, &c,
                                &err) != SPECINFER_OK) {
    std::fprintf(stderr, "SKIP: no constraint plugin (%s)\n", err ? err : "?");
    specinfer_free(err);
    e.close();
    skip();
  }
  specinfer_drafter *d = nullptr;
  assert_int_equal(specinfer_drafter_open(e.reg, "ngram", "text=1", e.target, &d, &err),
                   SPECINFER_OK);
  RunParams rp;
  rp.constraint = c;
  const std::vector<int32_t> plain = run_session(e.target, nullptr, kExtract, 64, rp);
  specinfer_session_stats st;
  const std::vector<int32_t> spec = run_session(e.target, d, kExtract, 64, rp, &st);
  expect_same_tokens(plain, spec, "greedy, ngram:text=1, json_schema", kExtract);
  std::fprintf(stderr, "ngram:text=1: %lld tokens in %lld rounds, %lld drafted, %lld kept\n",
               (long long)st.n_generated, (long long)st.n_rounds, (long long)st.n_drafted,
               (long long)st.n_accepted);
  assert_true(st.n_accepted > 0);
  specinfer_drafter_destroy(d);
  specinfer_constraint_destroy(c);
  e.close();
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_byte_tokens),
      cmocka_unit_test(test_json_value_from_prose),
      cmocka_unit_test(test_drafter_json_equals_plain),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
