// End of generation: a session stops at every token its target marks as ending generation
// (specinfer_model_info.eog_tokens), not only at eos and eot.
//  - A counting target in this process (each token's successor is the next id, mod its vocabulary;
//    no eos or eot, end-of-generation ids 7 and 12): a session started at token 3 emits 4 5 6 7
//    and ends there, plainly and with prompt lookup drafting through the end; the public info
//    lists the ids sorted with eos and eot merged in; a list naming an id outside the vocabulary
//    or a negative count is refused at open (PLUGIN, with a message).
//  - The real models (scripts/fetch-models; absent ones are skipped with a message): the gguf
//    plugin's list is sorted and holds eos and eot; Qwen2.5's holds <|endoftext|>, <|im_end|> and
//    the fill-in-middle end markers, Gemma 3's <eos> and <end_of_turn>; an ordinary word is not in
//    it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "specinfer.h"
#include "specinfer_plugin.h"

#include "support/cmocka_setup.h"
#include "support/models.h"

namespace {

// The counting target. Config: eog=<id>[;<id>...] (default 7;12), eos=<id> (default -1).
constexpr int32_t kVocab = 16;

struct Counting {
  std::vector<int32_t> eog;
  int32_t eos = -1;
  std::vector<int32_t> cache;
};

void c_destroy(void *self) {
  delete static_cast<Counting *>(self);
}

specinfer_status c_info(void *self, specinfer_model_info *info) {
  const auto *c = static_cast<Counting *>(self);
  specinfer_model_info full{};
  full.struct_size = info->struct_size;
  full.vocab_size = kVocab;
  full.n_ctx = 256;
  full.bos_token = -1;
  full.eos_token = c->eos;
  full.eot_token = -1;
  full.name = "counting";
  full.arch = "counting";
  full.eog_tokens = c->eog.data();
  full.n_eog_tokens = static_cast<int32_t>(c->eog.size());
  if (c->eog.size() == 1 && c->eog[0] == -100) full.n_eog_tokens = -1;  // a broken plugin
  std::memcpy(info, &full, std::min<size_t>(info->struct_size, sizeof full));
  return SPECINFER_OK;
}

// Text is one token per character 'a' + id.
specinfer_status c_tokenize(void *, const char *text, size_t len, int32_t, int32_t, int32_t *tokens,
                            size_t cap, size_t *n, specinfer_plugin_error *) {
  *n = len;
  if (cap < len) return SPECINFER_ERR_BUFFER_TOO_SMALL;
  for (size_t i = 0; i < len; ++i) tokens[i] = (text[i] - 'a') & (kVocab - 1);
  return SPECINFER_OK;
}

specinfer_status c_token_bytes(void *, int32_t token, char *buf, size_t cap, size_t *n,
                               specinfer_plugin_error *) {
  *n = 1;
  if (cap < 1) return SPECINFER_ERR_BUFFER_TOO_SMALL;
  buf[0] = static_cast<char>('a' + token);
  return SPECINFER_OK;
}

specinfer_status c_forward(void *self, const specinfer_forward_batch *b, specinfer_plugin_error *) {
  auto *c = static_cast<Counting *>(self);
  for (int32_t i = 0; i < b->n_tokens; ++i) c->cache.push_back(b->tokens[i]);
  for (int32_t i = 0; i < b->n_logits; ++i) {
    const int32_t t = b->tokens[b->n_tokens - b->n_logits + i];
    float *row = b->logits + static_cast<size_t>(i) * kVocab;
    for (int32_t v = 0; v < kVocab; ++v) row[v] = v == (t + 1) % kVocab ? 10.0f : 0.0f;
  }
  return SPECINFER_OK;
}

int32_t c_kv_size(void *self) {
  return static_cast<int32_t>(static_cast<Counting *>(self)->cache.size());
}

specinfer_status c_kv_truncate(void *self, int32_t n_keep, specinfer_plugin_error *) {
  auto *c = static_cast<Counting *>(self);
  if (n_keep < 0 || static_cast<size_t>(n_keep) > c->cache.size())
    return SPECINFER_ERR_INVALID_ARGUMENT;
  c->cache.resize(static_cast<size_t>(n_keep));
  return SPECINFER_OK;
}

const specinfer_target_vtable kCountingVtable = [] {
  specinfer_target_vtable v{};
  v.struct_size = offsetof(specinfer_target_vtable, output_rows);  // no optional functions
  v.destroy = c_destroy;
  v.info = c_info;
  v.tokenize = c_tokenize;
  v.token_bytes = c_token_bytes;
  v.forward = c_forward;
  v.kv_size = c_kv_size;
  v.kv_truncate = c_kv_truncate;
  return v;
}();

specinfer_status c_create(const specinfer_host *, const char *config, void **self,
                          const specinfer_target_vtable **vt, specinfer_plugin_error *) {
  auto *c = new Counting;
  c->eog = {12, 7};  // unsorted on purpose
  const std::string cfg = config ? config : "";
  if (cfg.rfind("eog=", 0) == 0) {
    c->eog.clear();
    size_t at = 4;
    while (at <= cfg.size()) {
      const size_t end = std::min(cfg.find(';', at), cfg.find(',', at));
      c->eog.push_back(std::atoi(cfg.substr(at, end - at).c_str()));
      if (end == std::string::npos || cfg[end] == ',') break;
      at = end + 1;
    }
  }
  if (const size_t e = cfg.find("eos="); e != std::string::npos)
    c->eos = std::atoi(cfg.c_str() + e + 4);
  *self = c;
  *vt = &kCountingVtable;
  return SPECINFER_OK;
}

const specinfer_target_factory kCountingFactory = {sizeof(specinfer_target_factory), c_create};
const void *counting_factory(const char *id) {
  return std::strcmp(id, SPECINFER_TARGET_FACTORY_ID) == 0 ? &kCountingFactory : nullptr;
}
const specinfer_plugin_descriptor kCountingPlugin = {SPECINFER_PLUGIN_ABI_VERSION,
                                                     sizeof(specinfer_plugin_descriptor),
                                                     "counting",
                                                     "1",
                                                     "each token's successor is the next id",
                                                     nullptr,
                                                     nullptr,
                                                     counting_factory};

specinfer_registry *registry() {
  specinfer_registry_params p;
  specinfer_registry_params_init(&p);
  p.n_threads = 2;
  specinfer_registry *reg = nullptr;
  assert_int_equal(specinfer_registry_create(&p, &reg, nullptr), SPECINFER_OK);
  assert_int_equal(specinfer_registry_register_plugin(reg, &kCountingPlugin, nullptr),
                   SPECINFER_OK);
  return reg;
}

// Greedy tokens after `prompt` (at most n), with the drafter (NULL: plain); *done: ended at an
// end-of-generation token.
std::vector<int32_t> generate(specinfer_target *t, specinfer_drafter *d,
                              const std::vector<int32_t> &prompt, int n, bool *done) {
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.max_draft = 8;
  specinfer_session *s = nullptr;
  assert_int_equal(specinfer_session_create(t, d, nullptr, &p, &s, nullptr), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_tokens(s, prompt.data(), prompt.size()), SPECINFER_OK);
  std::vector<int32_t> out;
  *done = false;
  std::vector<int32_t> buf(16);
  while (static_cast<int>(out.size()) < n && !*done) {
    specinfer_step_result r{};
    r.struct_size = sizeof r;
    r.tokens = buf.data();
    r.cap = buf.size();
    specinfer_session *one[1] = {s};
    assert_int_equal(specinfer_session_step_many(one, &r, 1, nullptr), SPECINFER_OK);
    assert_int_equal(r.status, SPECINFER_OK);
    out.insert(out.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(r.n_tokens));
    *done = r.done != 0;
  }
  specinfer_session_destroy(s);
  return out;
}

void test_counting_target_stops(void **) {
  specinfer_registry *reg = registry();
  specinfer_target *t = nullptr;
  char *err = nullptr;
  assert_int_equal(specinfer_target_open(reg, "counting", "eos=14", &t, &err), SPECINFER_OK);
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  assert_int_equal(specinfer_target_info(t, &info), SPECINFER_OK);
  assert_int_equal(info.n_eog_tokens, 3);
  assert_int_equal(info.eog_tokens[0], 7);
  assert_int_equal(info.eog_tokens[1], 12);
  assert_int_equal(info.eog_tokens[2], 14);  // eos merged in

  bool done = false;
  const std::vector<int32_t> want = {4, 5, 6, 7};
  assert_true(generate(t, nullptr, {3}, 20, &done) == want);
  assert_true(done);
  // Past 7 the next end is 12: from 8 the session emits 9 10 11 12.
  assert_true(generate(t, nullptr, {8}, 20, &done) == (std::vector<int32_t>{9, 10, 11, 12}));
  assert_true(done);
  // Prompt lookup proposes the cycle's continuation through 7 and beyond; the session keeps
  // nothing after the end.
  specinfer_drafter *d = nullptr;
  assert_int_equal(specinfer_drafter_open(reg, "ngram", "", t, &d, &err), SPECINFER_OK);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 3 * kVocab; ++i) prompt.push_back((i + 8) % kVocab);  // ends at 7: 8 .. 7
  prompt.resize(prompt.size() - 4);                                         // ends at 3
  assert_true(generate(t, d, prompt, 20, &done) == want);
  assert_true(done);
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);

  // A plugin's list with an id outside the vocabulary, or a negative count: refused at open.
  for (const char *bad : {"eog=7;16", "eog=-3", "eog=-100"}) {
    specinfer_target *none = nullptr;
    const specinfer_status rc = specinfer_target_open(reg, "counting", bad, &none, &err);
    std::printf("counting:%s -> %s: %s\n", bad, specinfer_status_str(rc), err ? err : "");
    assert_int_equal(rc, SPECINFER_ERR_PLUGIN);
    assert_null(none);
    assert_non_null(err);
    assert_non_null(std::strstr(err, "end-of-generation"));
    specinfer_free(err);
    err = nullptr;
  }
  specinfer_registry_destroy(reg);
}

// The id of a special token spelled out, or -1 when the text is not one token.
int32_t special_id(specinfer_target *t, const char *text) {
  int32_t ids[8];
  size_t n = 0;
  if (specinfer_target_tokenize(t, text, std::strlen(text), 0, 1, ids, 8, &n) != SPECINFER_OK ||
      n != 1)
    return -1;
  return ids[0];
}

void check_model(const char *file, const std::vector<const char *> &ends) {
  char path[4096];
  if (!model_path(file, path, sizeof path)) {
    std::printf("skipped: %s is not in %s (scripts/fetch-models)\n", file, models_dir());
    return;
  }
  specinfer_registry *reg = registry();
  specinfer_target *t = nullptr;
  const std::string cfg = std::string("path=") + path + ",n_ctx=256";
  assert_int_equal(specinfer_target_open(reg, "gguf", cfg.c_str(), &t, nullptr), SPECINFER_OK);
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  assert_int_equal(specinfer_target_info(t, &info), SPECINFER_OK);
  assert_true(info.n_eog_tokens > 0 && info.eog_tokens != nullptr);
  assert_true(std::is_sorted(info.eog_tokens, info.eog_tokens + info.n_eog_tokens));
  const auto listed = [&](int32_t id) {
    return std::binary_search(info.eog_tokens, info.eog_tokens + info.n_eog_tokens, id);
  };
  assert_true(info.eos_token < 0 || listed(info.eos_token));
  assert_true(info.eot_token < 0 || listed(info.eot_token));
  std::printf("%s: eos %d, eot %d, %d end-of-generation tokens\n", file, info.eos_token,
              info.eot_token, info.n_eog_tokens);
  for (const char *text : ends) {
    const int32_t id = special_id(t, text);
    std::printf("  %s = %d\n", text, id);
    assert_true(id >= 0);
    assert_true(listed(id));
  }
  // Ordinary text is not an end.
  const int32_t word = special_id(t, "def");
  assert_true(word >= 0 && !listed(word));
  specinfer_target_destroy(t);
  specinfer_registry_destroy(reg);
}

void test_qwen_end_tokens(void **) {
  check_model("qwen2.5-coder-0.5b.gguf",
              {"<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"});
}

void test_gemma_end_tokens(void **) {
  check_model("gemma-3-270m.gguf", {"<eos>", "<end_of_turn>"});
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counting_target_stops),
      cmocka_unit_test(test_qwen_end_tokens),
      cmocka_unit_test(test_gemma_end_tokens),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
