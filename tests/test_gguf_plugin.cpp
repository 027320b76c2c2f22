// The gguf plugin through its ABI: the built specinfer-gguf.so is dlopen'ed, its target factory
// creates targets over a tiny GGUF model, and every vtable entry is exercised, including the
// error paths (config keys, missing files, bad arguments, small buffers) that must come back as
// status + message.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "data/gguf/tiny_model.h"
#include "plugin/host.h"
#include "specinfer.h"
#include "specinfer_plugin.h"

#include <stdint.h>

#include "support/cmocka_setup.h"
#include "support/plugin_file.h"

using namespace gguf_test;

namespace {

struct Fixture {
  void *so = nullptr;
  const specinfer_target_factory *factory = nullptr;
  std::string model_path;
  TinyConfig cfg;
  TinyWeights w;
};

int setup(void **state) {
  auto *fx = new Fixture();
  const specinfer_plugin_descriptor *desc = open_plugin_file("gguf", &fx->so);
  if (!desc) {
    delete fx;
    return -1;
  }
  fx->factory =
      static_cast<const specinfer_target_factory *>(desc->get_factory(SPECINFER_TARGET_FACTORY_ID));
  if (!fx->factory || desc->get_factory("specinfer.drafter-factory/1") != nullptr) {
    delete fx;
    return -1;
  }
  std::vector<uint8_t> bytes = make_tiny_model(fx->cfg, &fx->w);
  char path[] = "/tmp/test_gguf_plugin_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  close(fd);
  fx->model_path = path;
  if (!write_file(path, bytes)) return -1;
  *state = fx;
  return 0;
}

int teardown(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  if (fx == nullptr) return 0;  // setup failed (and said why)
  unlink(fx->model_path.c_str());
  dlclose(fx->so);
  delete fx;
  return 0;
}

specinfer_status create(Fixture *fx, const std::string &config, void **self,
                        const specinfer_target_vtable **vt, specinfer_plugin_error *err) {
  std::memset(err->message, 0, sizeof err->message);
  return fx->factory->create(specinfer::default_host(), config.c_str(), self, vt, err);
}

void test_config_errors(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  void *self = nullptr;
  const specinfer_target_vtable *vt = nullptr;
  specinfer_plugin_error err;
  assert_int_equal(create(fx, "path=" + fx->model_path + ",colour=blue", &self, &vt, &err),
                   SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "colour"));
  assert_null(self);
  assert_int_equal(create(fx, "n_ctx=64", &self, &vt, &err), SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "path"));
  assert_int_equal(create(fx, "path=" + fx->model_path + ",n_ctx=abc", &self, &vt, &err),
                   SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "n_ctx"));
  assert_int_equal(create(fx, "path=" + fx->model_path + ",n_ctx", &self, &vt, &err),
                   SPECINFER_ERR_CONFIG);
  assert_int_equal(create(fx, "path=" + fx->model_path + ",requant=q5_0", &self, &vt, &err),
                   SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "requant"));
  assert_int_equal(create(fx, "path=" + fx->model_path + ",kv_type=q5_1", &self, &vt, &err),
                   SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "kv_type"));
  // A key given twice is refused, not read as its last value.
  assert_int_equal(
      create(fx, "path=" + fx->model_path + ",kv_type=q8_0,kv_type=f16", &self, &vt, &err),
      SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "'kv_type' given twice"));
  assert_null(self);
  for (const char *bad : {",attn=sparse", ",attn=qjl,attn_bits=48", ",attn=qjl,attn_bits=2048",
                          ",attn=qjl,attn_keys=0", ",attn=qjl,attn_window=-1",
                          ",attn=qjl,attn_sink=x", ",attn=qjl,attn_rescore=-5"}) {
    assert_int_equal(create(fx, "path=" + fx->model_path + bad, &self, &vt, &err),
                     SPECINFER_ERR_CONFIG);
    assert_non_null(std::strstr(err.message, "attn"));
    assert_null(self);
  }
  // A valid requant on the tiny model loads (its F32 matrices become Q4_0, or Q3_0).
  for (const char *requant : {",requant=q4_0", ",requant=q3_0"}) {
    assert_int_equal(create(fx, "path=" + fx->model_path + requant, &self, &vt, &err),
                     SPECINFER_OK);
    assert_non_null(self);
    vt->destroy(self);
    self = nullptr;
  }
  assert_int_equal(create(fx, "path=/nonexistent/model.gguf", &self, &vt, &err),
                   SPECINFER_ERR_NOT_FOUND);
  assert_non_null(std::strstr(err.message, "/nonexistent/model.gguf"));
  // A file that is not GGUF.
  assert_int_equal(create(fx, "path=/tmp", &self, &vt, &err), SPECINFER_ERR_IO);
  char notgguf[] = "/tmp/test_gguf_plugin_bad_XXXXXX";
  int fd = mkstemp(notgguf);
  assert_true(fd >= 0);
  assert_true(write(fd, "this is not a gguf file at all", 30) == 30);
  close(fd);
  assert_int_equal(create(fx, std::string("path=") + notgguf, &self, &vt, &err),
                   SPECINFER_ERR_FORMAT);
  assert_non_null(std::strstr(err.message, "magic"));
  unlink(notgguf);
  assert_null(self);
}

void test_target(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  void *self = nullptr;
  const specinfer_target_vtable *vt = nullptr;
  specinfer_plugin_error err;
  // An f32 cache: the reference below is f32 arithmetic.
  assert_int_equal(
      create(fx, " path = " + fx->model_path + " , n_ctx=32 ,kv_type=f32", &self, &vt, &err),
      SPECINFER_OK);
  assert_non_null(self);
  assert_true(vt->struct_size >= sizeof(specinfer_target_vtable));

  specinfer_model_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_int_equal(vt->info(self, &info), SPECINFER_OK);
  assert_int_equal(info.vocab_size, fx->cfg.n_vocab);
  assert_int_equal(info.n_ctx, 32);
  assert_int_equal(info.hidden_size, fx->cfg.n_embd);
  assert_int_equal(info.eos_token, 0);
  assert_int_equal(info.eot_token, 1);  // <|im_end|>
  assert_int_equal(info.add_bos, 0);
  assert_string_equal(info.arch, "qwen2");
  assert_string_equal(info.name, "tiny-qwen2");
  assert_null(info.chat_template);  // the file has none

  // Tokenize: single-byte tokens ('#' = id 2, ...), the special token parsed on request.
  const char *text = "#$<|im_end|>";
  int32_t toks[16];
  size_t n = 0;
  assert_int_equal(vt->tokenize(self, text, std::strlen(text), 0, 1, toks, 16, &n, &err),
                   SPECINFER_OK);
  assert_int_equal(n, 3);
  assert_int_equal(toks[0], 2);
  assert_int_equal(toks[1], 3);
  assert_int_equal(toks[2], 1);
  assert_int_equal(vt->tokenize(self, text, std::strlen(text), 0, 1, toks, 2, &n, &err),
                   SPECINFER_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(n, 3);
  assert_int_equal(vt->tokenize(self, nullptr, 5, 0, 1, toks, 16, &n, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);

  char buf[32];
  size_t nb = 0;
  assert_int_equal(vt->token_bytes(self, 2, buf, sizeof buf, &nb, &err), SPECINFER_OK);
  assert_int_equal(nb, 1);
  assert_int_equal(buf[0], '#');
  assert_int_equal(vt->token_bytes(self, 1, buf, 3, &nb, &err), SPECINFER_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(nb, std::strlen("<|im_end|>"));
  assert_int_equal(vt->token_bytes(self, 1000, buf, sizeof buf, &nb, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_true(std::strlen(err.message) > 0);

  // Forward through the vtable == the reference.
  const int nt = 5;
  int32_t ids[nt] = {4, 9, 17, 3, 30}, pos[nt] = {0, 1, 2, 3, 4};
  std::vector<float> logits(size_t(2) * size_t(fx->cfg.n_vocab)),
      hidden(size_t(2) * size_t(fx->cfg.n_embd));
  specinfer_forward_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.n_tokens = nt;
  b.tokens = ids;
  b.positions = pos;
  b.n_logits = 2;
  b.logits = logits.data();
  b.hidden = hidden.data();
  assert_int_equal(vt->forward(self, &b, &err), SPECINFER_OK);
  assert_int_equal(vt->kv_size(self), nt);
  std::vector<double> ref;
  reference_forward(fx->cfg, fx->w, std::vector<int32_t>(ids, ids + nt),
                    std::vector<int32_t>(pos, pos + nt), causal_mask(nt), &ref, nullptr);
  double d = 0;
  for (int r = 0; r < 2; r++)
    for (int v = 0; v < fx->cfg.n_vocab; v++)
      d = std::max(d, std::fabs(double(logits[size_t(r * fx->cfg.n_vocab + v)]) -
                                ref[size_t((nt - 2 + r) * fx->cfg.n_vocab + v)]));
  assert_true(d < 1e-3);

  // Errors from forward and the cache calls.
  int32_t bad = 999;
  b.tokens = &bad;
  b.n_tokens = 1;
  b.n_logits = 1;
  assert_int_equal(vt->forward(self, &b, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err.message, "vocabulary"));
  b.struct_size = 8;
  assert_int_equal(vt->forward(self, &b, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(vt->forward(self, nullptr, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  int32_t keep_bad[] = {3, 1};
  assert_int_equal(vt->kv_keep(self, 0, keep_bad, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  int32_t keep[] = {1, 3};
  assert_int_equal(vt->kv_keep(self, 1, keep, 2, &err), SPECINFER_OK);
  assert_int_equal(vt->kv_size(self), 3);
  assert_int_equal(vt->kv_truncate(self, 1, &err), SPECINFER_OK);
  assert_int_equal(vt->kv_size(self), 1);
  assert_int_equal(vt->kv_truncate(self, -2, &err), SPECINFER_ERR_INVALID_ARGUMENT);

  // The context is 32: 40 tokens do not fit.
  std::vector<int32_t> many(40, 5), mpos(40);
  for (int i = 0; i < 40; i++) mpos[size_t(i)] = i + 1;
  b.struct_size = sizeof b;
  b.tokens = many.data();
  b.positions = mpos.data();
  b.n_tokens = 40;
  b.n_logits = 0;
  b.hidden = nullptr;
  assert_int_equal(vt->forward(self, &b, &err), SPECINFER_ERR_CONTEXT_FULL);
  assert_int_equal(vt->kv_size(self), 1);

  vt->destroy(self);
}

// A forward batch for tokens at consecutive positions from pos0 (tree mask optional).
struct Pass {
  std::vector<int32_t> tokens, positions;
  std::vector<uint8_t> mask;
  int32_t n_logits = 0;
  std::vector<float> logits, hidden;
  specinfer_forward_batch batch(int32_t n_vocab, int32_t n_embd) {
    logits.assign(size_t(n_logits) * size_t(n_vocab), 0.0f);
    hidden.assign(size_t(n_logits) * size_t(n_embd), 0.0f);
    specinfer_forward_batch b;
    std::memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_tokens = int32_t(tokens.size());
    b.tokens = tokens.data();
    b.positions = positions.data();
    b.tree_mask = mask.empty() ? nullptr : mask.data();
    b.n_logits = n_logits;
    b.logits = logits.data();
    b.hidden = hidden.data();
    return b;
  }
};

Pass chain(int32_t first, int32_t n, int32_t pos0, int32_t n_logits) {
  Pass p;
  for (int32_t i = 0; i < n; i++) {
    p.tokens.push_back(4 + (first + 7 * i) % 70);
    p.positions.push_back(pos0 + i);
  }
  p.n_logits = n_logits;
  return p;
}

// share() and forward_many(): sequences on one loaded model, alone or in one pass, give the same
// bits; the model outlives whichever instance is destroyed first; bad calls are refused.
void check_shared_sequences(Fixture *fx, const std::string &extra) {
  void *a = nullptr;
  const specinfer_target_vtable *vt = nullptr;
  specinfer_plugin_error err;
  assert_int_equal(create(fx, "path=" + fx->model_path + ",n_ctx=64" + extra, &a, &vt, &err),
                   SPECINFER_OK);
  assert_true(vt->struct_size >= offsetof(specinfer_target_vtable, forward_many) + sizeof(void *));
  const int32_t V = fx->cfg.n_vocab, E = fx->cfg.n_embd;
  // Three sequences alone (s[0..2]) and the same three together (t[0..2]), all shares of a.
  void *s[3], *t[3];
  for (int i = 0; i < 3; i++) {
    assert_int_equal(vt->share(a, &s[i], &err), SPECINFER_OK);
    assert_int_equal(vt->share(a, &t[i], &err), SPECINFER_OK);
    assert_int_equal(vt->kv_size(s[i]), 0);
  }
  vt->destroy(a);  // the shares keep the model
  assert_int_equal(vt->share(nullptr, &a, &err), SPECINFER_ERR_INVALID_ARGUMENT);

  // Round 1: prompts of different lengths. Round 2: one token, a tree of four, a chain of three.
  std::vector<std::vector<Pass>> rounds(2);
  rounds[0] = {chain(1, 5, 0, 1), chain(2, 9, 0, 2), chain(3, 2, 0, 2)};
  rounds[1] = {chain(4, 1, 5, 1), chain(5, 4, 9, 4), chain(6, 3, 2, 3)};
  Pass &tree = rounds[1][1];
  const int32_t parent[4] = {-1, 0, 0, 1};
  tree.mask.assign(16, 0);
  for (int32_t i = 0; i < 4; i++) {
    tree.positions[size_t(i)] = parent[i] < 0 ? 9 : tree.positions[size_t(parent[i])] + 1;
    for (int32_t j = i; j >= 0; j = parent[j]) tree.mask[size_t(i) * 4 + size_t(j)] = 1;
  }
  for (auto &round : rounds) {
    std::vector<Pass> together = round;
    std::vector<specinfer_forward_batch> bs;
    for (int i = 0; i < 3; i++) {
      specinfer_forward_batch b = round[size_t(i)].batch(V, E);
      assert_int_equal(vt->forward(s[i], &b, &err), SPECINFER_OK);
      bs.push_back(together[size_t(i)].batch(V, E));
    }
    assert_int_equal(vt->forward_many(t, bs.data(), 3, &err), SPECINFER_OK);
    for (int i = 0; i < 3; i++) {
      assert_int_equal(vt->kv_size(t[i]), vt->kv_size(s[i]));
      const Pass &x = round[size_t(i)], &y = together[size_t(i)];
      assert_memory_equal(x.logits.data(), y.logits.data(), x.logits.size() * sizeof(float));
      assert_memory_equal(x.hidden.data(), y.hidden.data(), x.hidden.size() * sizeof(float));
    }
  }

  // Refused, and nothing changes: an instance twice, a bad token in one of the batches, a NULL.
  const int32_t before = vt->kv_size(t[0]);
  Pass p0 = chain(7, 2, before, 1), p1 = chain(8, 2, vt->kv_size(t[1]), 1);
  specinfer_forward_batch bs[2] = {p0.batch(V, E), p1.batch(V, E)};
  void *twice[2] = {t[0], t[0]};
  assert_int_equal(vt->forward_many(twice, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err.message, "same"));
  p1.tokens[1] = 999;
  assert_int_equal(vt->forward_many(t, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err.message, "vocabulary"));
  assert_int_equal(vt->kv_size(t[0]), before);
  void *with_null[2] = {t[0], nullptr};
  assert_int_equal(vt->forward_many(with_null, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(vt->forward_many(t, bs, 0, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  // Instances of another loaded model (a second create of the same file) do not mix.
  void *other = nullptr;
  assert_int_equal(create(fx, "path=" + fx->model_path + ",n_ctx=64" + extra, &other, &vt, &err),
                   SPECINFER_OK);
  p1.tokens[1] = 9;
  void *mixed[2] = {t[0], other};
  assert_int_equal(vt->forward_many(mixed, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err.message, "other weights"));
  assert_int_equal(vt->kv_size(t[0]), before);
  vt->destroy(other);
  for (int i = 0; i < 3; i++) {
    vt->destroy(s[i]);
    vt->destroy(t[i]);
  }
}

void test_shared_sequences(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  check_shared_sequences(fx, "");                 // float weights (below the sgemm threshold)
  check_shared_sequences(fx, ",requant=q4_0");    // packed quantized weights
  check_shared_sequences(fx, ",requant=q3_0");    // the same at three bits
  check_shared_sequences(fx, ",vocab_limit=40");  // per-sequence extra output rows
}

}  // namespace

// With a vocabulary limit, a sequence keeps computing the logits of the ids above it that it was
// fed, but at most vocab_extra of them besides the end-of-generation ids (pinned at creation):
// past that the older ones go, so a long-lived draft model that sees ever new rare tokens stays
// bounded. Fed one id above the limit per pass, the ids with logits are always the pinned ones,
// the one just fed, and at most vocab_extra - 1 others; the first one fed is dropped in the end.
void test_vocab_extra_cap(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  void *t = nullptr;
  const specinfer_target_vtable *vt = nullptr;
  specinfer_plugin_error err;
  const int32_t V = fx->cfg.n_vocab, E = fx->cfg.n_embd, limit = 40, cap = 4;
  assert_int_equal(create(fx, "path=" + fx->model_path + ",n_ctx=64,vocab_limit=40,vocab_extra=4",
                          &t, &vt, &err),
                   SPECINFER_OK);
  const auto above_with_logits = [&](const Pass &p) {
    std::vector<int32_t> ids;
    for (int32_t v = limit; v < V; v++)
      if (std::isfinite(p.logits[size_t(v)])) ids.push_back(v);
    return ids;
  };
  Pass first = chain(1, 1, 0, 1);
  specinfer_forward_batch b = first.batch(V, E);
  assert_int_equal(vt->forward(t, &b, &err), SPECINFER_OK);
  const std::vector<int32_t> pinned = above_with_logits(first);
  const auto is_pinned = [&](int32_t v) {
    return std::find(pinned.begin(), pinned.end(), v) != pinned.end();
  };
  std::vector<int32_t> fed;
  for (int32_t id = limit + 1; id < V && fed.size() < 10; id++) {
    if (is_pinned(id)) continue;
    Pass p;
    p.tokens = {id};
    p.positions = {vt->kv_size(t)};
    p.n_logits = 1;
    b = p.batch(V, E);
    assert_int_equal(vt->forward(t, &b, &err), SPECINFER_OK);
    fed.push_back(id);
    const std::vector<int32_t> have = above_with_logits(p);
    for (int32_t v : pinned) assert_true(std::find(have.begin(), have.end(), v) != have.end());
    assert_true(std::find(have.begin(), have.end(), id) != have.end());
    assert_true(have.size() <= pinned.size() + size_t(cap));
    for (int32_t v : have)
      assert_true(is_pinned(v) || std::find(fed.begin(), fed.end(), v) != fed.end());
    if (fed.size() == 10) assert_true(std::find(have.begin(), have.end(), fed[0]) == have.end());
  }
  assert_int_equal(fed.size(), 10);
  vt->destroy(t);
}

// A target over a tiny model written to a temporary file (removed when the target is made).
specinfer_status create_from(Fixture *fx, const std::vector<uint8_t> &bytes,
                             const std::string &options, void **self,
                             const specinfer_target_vtable **vt, specinfer_plugin_error *err) {
  char path[] = "/tmp/test_gguf_plugin_XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_true(write_file(path, bytes));
  const specinfer_status rc = create(fx, std::string("path=") + path + options, self, vt, err);
  unlink(path);
  return rc;
}

// The file's chat template, as the model info gives it.
void test_chat_template(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  Writer w;
  make_tiny_model(fx->cfg, nullptr, &w);
  const std::string tmpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  w.kv_str("tokenizer.chat_template", tmpl);
  void *self = nullptr;
  const specinfer_target_vtable *vt = nullptr;
  specinfer_plugin_error err;
  assert_int_equal(create_from(fx, w.build(), "", &self, &vt, &err), SPECINFER_OK);
  specinfer_model_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_int_equal(vt->info(self, &info), SPECINFER_OK);
  assert_non_null(info.chat_template);
  assert_string_equal(info.chat_template, tmpl.c_str());
  // A caller whose struct ends before the field gets nothing written past its end.
  specinfer_model_info old;
  std::memset(&old, 0x5a, sizeof old);
  old.struct_size = offsetof(specinfer_model_info, chat_template);
  assert_int_equal(vt->info(self, &old), SPECINFER_OK);
  const auto *tail = reinterpret_cast<const unsigned char *>(&old.chat_template);
  for (size_t i = 0; i < sizeof old.chat_template; ++i) assert_int_equal(tail[i], 0x5a);
  vt->destroy(self);
}

// Queries and keys through forward's observer: once per layer in order, with the pass's shapes
// and each layer's sliding window, the same vectors whether the tokens come in one pass or two,
// and nothing for a caller that gives no observer or whose batch ends before the field.
struct Observed {
  std::vector<specinfer_qk_view> views;
  std::vector<std::vector<float>> q, k;
};

void observe(void *ctx, const specinfer_qk_view *v) {
  auto &o = *static_cast<Observed *>(ctx);
  o.views.push_back(*v);
  const size_t nq = size_t(v->n_tokens) * size_t(v->n_head) * size_t(v->head_dim),
               nk = size_t(v->n_tokens) * size_t(v->n_head_kv) * size_t(v->head_dim);
  o.q.emplace_back(v->q, v->q + nq);
  o.k.emplace_back(v->k, v->k + nk);
}

void test_qk_observer(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  TinyConfig c;
  c.arch = "gemma3";
  c.n_layer = 6;  // layers 0-4 slide over a window of 4, layer 5 sees everything
  c.swa = 4;
  const std::vector<uint8_t> bytes = make_tiny_model(c, nullptr);
  const int n = 10;
  std::vector<int32_t> toks(n), pos(n);
  for (int i = 0; i < n; ++i) {
    toks[size_t(i)] = 2 + (i * 7) % (c.n_vocab - 2);
    pos[size_t(i)] = i;
  }
  auto run = [&](const std::vector<int> &splits, Observed *o, uint32_t struct_size) {
    void *self = nullptr;
    const specinfer_target_vtable *vt = nullptr;
    specinfer_plugin_error err;
    assert_int_equal(create_from(fx, bytes, ",kv_type=f32", &self, &vt, &err), SPECINFER_OK);
    int at = 0;
    for (int len : splits) {
      specinfer_forward_batch b{};
      b.struct_size = struct_size;
      b.n_tokens = len;
      b.tokens = toks.data() + at;
      b.positions = pos.data() + at;
      b.qk_observer = o ? observe : nullptr;
      b.qk_ctx = o;
      assert_int_equal(vt->forward(self, &b, &err), SPECINFER_OK);
      at += len;
    }
    vt->destroy(self);
  };
  Observed one, two;
  run({n}, &one, sizeof(specinfer_forward_batch));
  run({6, 4}, &two, sizeof(specinfer_forward_batch));
  assert_int_equal(one.views.size(), size_t(c.n_layer));
  assert_int_equal(two.views.size(), size_t(2 * c.n_layer));
  const int hd = c.n_embd / c.n_head;
  for (size_t i = 0; i < two.views.size(); ++i) {
    const specinfer_qk_view &v = two.views[i];
    const int layer = int(i) % c.n_layer, first = i < size_t(c.n_layer) ? 0 : 6;
    assert_int_equal(v.struct_size, sizeof(specinfer_qk_view));
    assert_int_equal(v.layer, layer);
    assert_int_equal(v.n_layer, c.n_layer);
    assert_int_equal(v.n_tokens, first == 0 ? 6 : 4);
    assert_int_equal(v.first_pos, first);
    assert_int_equal(v.n_head, c.n_head);
    assert_int_equal(v.n_head_kv, c.n_head_kv);
    assert_int_equal(v.head_dim, hd);
    assert_int_equal(v.window, layer == c.n_layer - 1 ? 0 : c.swa);
    // Token t of this pass equals token first + t of the single pass, bit for bit.
    const size_t qw = size_t(c.n_head) * hd, kw = size_t(c.n_head_kv) * hd;
    const std::vector<float> &q1 = one.q[size_t(layer)], &k1 = one.k[size_t(layer)];
    assert_memory_equal(two.q[i].data(), q1.data() + size_t(first) * qw, two.q[i].size() * 4);
    assert_memory_equal(two.k[i].data(), k1.data() + size_t(first) * kw, two.k[i].size() * 4);
    bool nonzero = false;
    for (float x : two.k[i]) nonzero = nonzero || (std::isfinite(x) && x != 0.0f);
    assert_true(nonzero);
  }
  // A batch that ends before the observer's fields is not observed.
  Observed none;
  run({n}, &none, offsetof(specinfer_forward_batch, qk_observer));
  assert_int_equal(none.views.size(), 0);
}

// A sliding-window model through the host (the public API): rewinds of the target's cache within
// the rollback margin keep what they ask, one further back is refused with STATE and keeps
// nothing, and sessions (a second prompt sharing a short prefix with the cached text, and
// speculation, whose rounds cut inside their own pass) emit what they emit with swa_full=1.
void test_sliding_window_host(void **) {
  TinyConfig c = tiny_gemma3();
  c.n_embd = 256;
  c.wtype = 8;  // Q8_0: logits independent of how passes split the text (F32 uses OpenBLAS)
  c.swa = 64;
  c.n_ctx = 2048;
  char path[] = "/tmp/test_gguf_plugin_XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_true(write_file(path, make_tiny_model(c, nullptr)));
  specinfer_registry *reg = nullptr;
  assert_int_equal(specinfer_registry_create(nullptr, &reg, nullptr), SPECINFER_OK);
  specinfer_target *a = nullptr, *b = nullptr;
  const std::string cfg = std::string("path=") + path + ",kv_type=f32";
  assert_int_equal(specinfer_target_open(reg, "gguf", cfg.c_str(), &a, nullptr), SPECINFER_OK);
  assert_int_equal(specinfer_target_open(reg, "gguf", (cfg + ",swa_full=1").c_str(), &b, nullptr),
                   SPECINFER_OK);
  unlink(path);
  std::vector<int32_t> toks(1000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(2 + (i * 37 + i / 7) % 70);
  const int V = c.n_vocab;
  std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
  auto eval = [&](specinfer_target *t, int32_t n_past, int32_t from, int32_t n, float *lg,
                  int32_t *cached) {
    specinfer_eval_params p;
    specinfer_eval_params_init(&p);
    p.tokens = toks.data() + from;
    p.n_tokens = size_t(n);
    p.n_past = n_past;
    p.n_logits = 1;
    p.logits = lg;
    return specinfer_target_eval(t, &p, cached);
  };
  int32_t cached = -1;
  // Passes of 200: each hands back the keys no query at kSwaRollback (256) before it can see.
  for (int32_t at = 0; at < 1000; at += 200) {
    assert_int_equal(eval(a, at, at, 200, la.data(), nullptr), SPECINFER_OK);
    assert_int_equal(eval(b, at, at, 200, lb.data(), nullptr), SPECINFER_OK);
  }
  assert_memory_equal(la.data(), lb.data(), la.size() * sizeof(float));
  // Back 256 positions from the latest pass's start (800): kept, the same logits.
  assert_int_equal(eval(a, 544, 544, 10, la.data(), &cached), SPECINFER_OK);
  assert_int_equal(cached, 554);
  assert_int_equal(eval(b, 544, 544, 10, lb.data(), nullptr), SPECINFER_OK);
  assert_memory_equal(la.data(), lb.data(), la.size() * sizeof(float));
  // One further (position 543 would see 480, handed back): refused, nothing kept, and the
  // message says how to go on.
  assert_int_equal(eval(a, 543, 543, 10, la.data(), &cached), SPECINFER_ERR_STATE);
  assert_int_equal(cached, 0);
  assert_non_null(std::strstr(specinfer_target_errmsg(a), "swa_full=1"));
  assert_int_equal(eval(b, 100, 100, 10, lb.data(), &cached), SPECINFER_OK);
  assert_int_equal(cached, 110);

  // Sessions: a long prompt, then a new one sharing its first 50 tokens (plain decoding), then a
  // speculative one (ngram drafter) on the sliding-window target against plain on the full one.
  specinfer_drafter *ngram = nullptr;
  assert_int_equal(specinfer_drafter_open(reg, "ngram", "", a, &ngram, nullptr), SPECINFER_OK);
  auto generate = [&](specinfer_target *t, specinfer_drafter *d, std::vector<int32_t> prompt,
                      std::vector<std::vector<int32_t>> *outs) {
    specinfer_session *s = nullptr;
    assert_int_equal(specinfer_session_create(t, d, nullptr, nullptr, &s, nullptr), SPECINFER_OK);
    for (int round = 0; round < 2; ++round) {
      if (round == 1) {
        assert_int_equal(specinfer_session_reset(s), SPECINFER_OK);
        prompt.resize(50);
        prompt.insert(prompt.end(), toks.begin() + 700, toks.begin() + 730);
      }
      assert_int_equal(specinfer_session_feed_tokens(s, prompt.data(), prompt.size()),
                       SPECINFER_OK);
      assert_int_equal(specinfer_session_generate(s, 400, nullptr, nullptr), SPECINFER_OK);
      const int32_t *all = nullptr;
      size_t n = 0;
      assert_int_equal(specinfer_session_tokens(s, &all, &n), SPECINFER_OK);
      outs->emplace_back(all, all + n);
    }
    specinfer_session_destroy(s);
  };
  const std::vector<int32_t> prompt(toks.begin(), toks.begin() + 600);
  std::vector<std::vector<int32_t>> plain_a, plain_b, spec_a;
  generate(a, nullptr, prompt, &plain_a);
  generate(b, nullptr, prompt, &plain_b);
  generate(a, ngram, prompt, &spec_a);
  assert_true(plain_a == plain_b);
  assert_true(spec_a == plain_b);
  assert_true(plain_b[0].size() > 900);  // past the window and the rollback margin
  specinfer_drafter_destroy(ngram);
  specinfer_target_destroy(a);
  specinfer_target_destroy(b);
  specinfer_registry_destroy(reg);
}

// kv_tiles' default follows attn: a q8_0 cache keeps its keys in tiles (the query rounded to 8 bits
// for them) unless attn=qjl, whose picked keys are gathered faster from rows. Logits tell the
// layouts apart: the default's equal those of the layout it names, bit for bit, and differ from
// the other's.
void test_kv_tiles_default(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  TinyConfig c;
  c.n_embd = 128;  // head_dim 32: whole q8_0 blocks
  const std::vector<uint8_t> bytes = make_tiny_model(c, nullptr);
  const int n = 12;
  std::vector<int32_t> toks(n), pos(n);
  for (int i = 0; i < n; ++i) {
    toks[size_t(i)] = 2 + (i * 5) % (c.n_vocab - 2);
    pos[size_t(i)] = i;
  }
  auto logits = [&](const std::string &options) {
    void *self = nullptr;
    const specinfer_target_vtable *vt = nullptr;
    specinfer_plugin_error err;
    assert_int_equal(create_from(fx, bytes, ",kv_type=q8_0" + options, &self, &vt, &err),
                     SPECINFER_OK);
    std::vector<float> out(size_t(n) * size_t(c.n_vocab));
    specinfer_forward_batch b{};
    b.struct_size = sizeof b;
    b.n_tokens = n;
    b.tokens = toks.data();
    b.positions = pos.data();
    b.n_logits = n;
    b.logits = out.data();
    assert_int_equal(vt->forward(self, &b, &err), SPECINFER_OK);
    vt->destroy(self);
    return out;
  };
  const size_t bytes_n = size_t(n) * size_t(c.n_vocab) * sizeof(float);
  const auto tiles = logits(",kv_tiles=1"), rows = logits(",kv_tiles=0");
  assert_true(std::memcmp(tiles.data(), rows.data(), bytes_n) != 0);
  assert_memory_equal(logits("").data(), tiles.data(), bytes_n);
  const auto qjl = logits(",attn=qjl"), qjl_tiles = logits(",attn=qjl,kv_tiles=1");
  assert_memory_equal(qjl.data(), logits(",attn=qjl,kv_tiles=0").data(), bytes_n);
  assert_true(std::memcmp(qjl.data(), qjl_tiles.data(), bytes_n) != 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_errors),    cmocka_unit_test(test_target),
      cmocka_unit_test(test_chat_template),    cmocka_unit_test(test_qk_observer),
      cmocka_unit_test(test_shared_sequences), cmocka_unit_test(test_sliding_window_host),
      cmocka_unit_test(test_kv_tiles_default), cmocka_unit_test(test_vocab_extra_cap),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
