// The kgram target through its plugin ABI (the built specinfer-kgram.so, dlopen'ed): share()
// gives instances on one k-gram table with caches of their own, destroyed in any order and run on
// several threads at once; forward_many() gives each instance what its own forward() gives, and
// refuses a bad call (NULL, an instance twice, instances of different tables, a bad batch)
// without changing any instance.
// Then through the public ABI, so that sharing and step_many are tested without a real model:
// sessions on shares of one kgram target on four threads, and specinfer_session_step_many of
// sessions on shares (greedy and Gumbel-sampled, with and without a drafter, whole and chunked
// prompts) against lone sessions.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "plugin/host.h"
#include "specinfer.h"
#include "specinfer_plugin.h"

#include <stdint.h>

#include "support/cmocka_setup.h"
#include "support/plugin_file.h"

namespace {

constexpr int32_t kVocab = 256;

struct Fixture {
  void *so = nullptr;
  const specinfer_target_factory *factory = nullptr;
  std::string corpus;
};

int setup(void **state) {
  auto *fx = new Fixture();
  const specinfer_plugin_descriptor *desc = open_plugin_file("kgram", &fx->so);
  if (!desc) {
    delete fx;
    return -1;
  }
  fx->factory =
      static_cast<const specinfer_target_factory *>(desc->get_factory(SPECINFER_TARGET_FACTORY_ID));
  const char *root = std::getenv("SPECINFER_SOURCE_DIR");
  fx->corpus = std::string(root ? root : ".") + "/abi/specinfer.h";
  *state = fx;
  return fx->factory ? 0 : -1;
}

int teardown(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  if (fx == nullptr) return 0;
  dlclose(fx->so);
  delete fx;
  return 0;
}

// A target on the corpus with k and n_ctx; fails the test otherwise.
void *create(Fixture *fx, int k, int n_ctx, const specinfer_target_vtable **vt) {
  void *self = nullptr;
  specinfer_plugin_error err{};
  std::string cfg =
      "path=" + fx->corpus + ",k=" + std::to_string(k) + ",n_ctx=" + std::to_string(n_ctx);
  specinfer_status rc =
      fx->factory->create(specinfer::default_host(), cfg.c_str(), &self, vt, &err);
  if (rc != SPECINFER_OK) print_error("create %s: %s\n", cfg.c_str(), err.message);
  assert_int_equal(rc, SPECINFER_OK);
  assert_non_null(self);
  assert_true((*vt)->struct_size >=
              offsetof(specinfer_target_vtable, forward_many) + sizeof((*vt)->forward_many));
  assert_non_null((*vt)->share);
  assert_non_null((*vt)->forward_many);
  return self;
}

// A batch of text bytes (a chain, or a tree from parent links), logits for the last n_logits.
struct Pass {
  std::vector<int32_t> tokens, positions;
  std::vector<uint8_t> mask;
  int32_t n_logits = 0;
  std::vector<float> logits;

  specinfer_forward_batch batch() {
    logits.assign(static_cast<size_t>(n_logits) * kVocab, -1.0f);
    specinfer_forward_batch b;
    std::memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_tokens = static_cast<int32_t>(tokens.size());
    b.tokens = tokens.data();
    b.positions = positions.data();
    b.tree_mask = mask.empty() ? nullptr : mask.data();
    b.n_logits = n_logits;
    b.logits = logits.data();
    return b;
  }
};

Pass chain(const std::string &text, int32_t pos0, int32_t n_logits) {
  Pass p;
  for (size_t i = 0; i < text.size(); ++i) {
    p.tokens.push_back(static_cast<uint8_t>(text[i]));
    p.positions.push_back(pos0 + static_cast<int32_t>(i));
  }
  p.n_logits = n_logits;
  return p;
}

Pass tree(const std::string &text, const std::vector<int32_t> &parent, int32_t pos0) {
  Pass p = chain(text, pos0, static_cast<int32_t>(text.size()));
  const size_t n = text.size();
  p.mask.assign(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    p.positions[i] = parent[i] < 0 ? pos0 : p.positions[static_cast<size_t>(parent[i])] + 1;
    for (int32_t j = static_cast<int32_t>(i); j >= 0; j = parent[static_cast<size_t>(j)])
      p.mask[i * n + static_cast<size_t>(j)] = 1;
  }
  return p;
}

// The rounds every test runs: prompts of different lengths, then a chain, a tree and one token.
std::vector<std::vector<Pass>> rounds() {
  std::vector<std::vector<Pass>> r(2);
  r[0] = {chain("/* Creates a session", 0, 1), chain("typedef struct", 0, 3),
          chain("SPECINFER_API", 0, 13)};
  r[1] = {chain(" that", 20, 5), tree("_tar", {-1, 0, 0, 2}, 14), chain("_", 13, 1)};
  return r;
}

void test_share_and_forward_many(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  const specinfer_target_vtable *vt = nullptr;
  void *a = create(fx, 4, 256, &vt);
  specinfer_plugin_error err{};
  // Three sequences alone (s) and the same three in one call (t), all shares of a.
  void *s[3], *t[3];
  for (int i = 0; i < 3; ++i) {
    assert_int_equal(vt->share(a, &s[i], &err), SPECINFER_OK);
    assert_int_equal(vt->share(a, &t[i], &err), SPECINFER_OK);
    assert_int_equal(vt->kv_size(s[i]), 0);
  }
  // A share describes the same model.
  specinfer_model_info ia{}, is{};
  ia.struct_size = is.struct_size = sizeof ia;
  assert_int_equal(vt->info(a, &ia), SPECINFER_OK);
  assert_int_equal(vt->info(s[0], &is), SPECINFER_OK);
  assert_int_equal(is.n_ctx, 256);
  assert_int_equal(is.vocab_size, ia.vocab_size);
  assert_string_equal(is.name, ia.name);
  // The first instance goes first: its shares keep the table.
  Pass warm = chain("abc", 0, 1);
  specinfer_forward_batch wb = warm.batch();
  assert_int_equal(vt->forward(a, &wb, &err), SPECINFER_OK);
  vt->destroy(a);
  void *none = reinterpret_cast<void *>(1);
  assert_int_equal(vt->share(nullptr, &none, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(vt->share(s[0], nullptr, &err), SPECINFER_ERR_INVALID_ARGUMENT);

  for (auto &round : rounds()) {
    std::vector<Pass> together = round;
    std::vector<specinfer_forward_batch> bs;
    for (int i = 0; i < 3; ++i) {
      specinfer_forward_batch b = round[static_cast<size_t>(i)].batch();
      assert_int_equal(vt->forward(s[i], &b, &err), SPECINFER_OK);
      bs.push_back(together[static_cast<size_t>(i)].batch());
    }
    assert_int_equal(vt->forward_many(t, bs.data(), 3, &err), SPECINFER_OK);
    for (int i = 0; i < 3; ++i) {
      assert_int_equal(vt->kv_size(t[i]), vt->kv_size(s[i]));
      const Pass &x = round[static_cast<size_t>(i)], &y = together[static_cast<size_t>(i)];
      assert_memory_equal(x.logits.data(), y.logits.data(), x.logits.size() * sizeof(float));
      for (float v : y.logits) assert_true(v <= 0.0f && std::isfinite(v));  // log-probabilities
    }
  }
  // The caches are the instances' own: trimming one leaves its twin and the others as they are.
  assert_int_equal(vt->kv_truncate(t[0], 3, &err), SPECINFER_OK);
  assert_int_equal(vt->kv_size(t[0]), 3);
  assert_int_equal(vt->kv_size(s[0]), 25);
  assert_int_equal(vt->kv_size(t[1]), 18);
  for (int i = 0; i < 3; ++i) {
    vt->destroy(s[i]);
    vt->destroy(t[i]);
  }
}

void test_forward_many_errors(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  const specinfer_target_vtable *vt = nullptr;
  void *a = create(fx, 3, 32, &vt), *b = nullptr, *control = nullptr;
  specinfer_plugin_error err{};
  assert_int_equal(vt->share(a, &b, &err), SPECINFER_OK);
  assert_int_equal(vt->share(a, &control, &err), SPECINFER_OK);
  // a and control hold the same text; after each refused call a must still score as control.
  Pass pa = chain("int x", 0, 0), pb = chain("void", 0, 0), pc = chain("int x", 0, 0);
  specinfer_forward_batch ba = pa.batch(), bb = pb.batch(), bc = pc.batch();
  assert_int_equal(vt->forward(a, &ba, &err), SPECINFER_OK);
  assert_int_equal(vt->forward(b, &bb, &err), SPECINFER_OK);
  assert_int_equal(vt->forward(control, &bc, &err), SPECINFER_OK);

  Pass p0 = chain(" = 1", 5, 2), p1 = chain("(*f)", 4, 1);
  specinfer_forward_batch bs[2] = {p0.batch(), p1.batch()};
  void *ab[2] = {a, b};
  auto unchanged = [&] {
    assert_int_equal(vt->kv_size(a), 5);
    assert_int_equal(vt->kv_size(b), 4);
    for (float v : p0.logits) assert_true(v == -1.0f);  // no output written either
  };

  void *twice[2] = {a, a};
  assert_int_equal(vt->forward_many(twice, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err.message, "same instance"));
  unchanged();
  void *with_null[2] = {a, nullptr};
  assert_int_equal(vt->forward_many(with_null, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err.message, "NULL"));
  unchanged();
  assert_int_equal(vt->forward_many(nullptr, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(vt->forward_many(ab, nullptr, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(vt->forward_many(ab, bs, 0, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(vt->forward_many(ab, bs, -1, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  unchanged();
  // An instance of another table (a second create of the same file is another table).
  const specinfer_target_vtable *vt2 = nullptr;
  void *other = create(fx, 3, 32, &vt2);
  Pass po = chain("void", 0, 0);
  specinfer_forward_batch bo = po.batch();
  assert_int_equal(vt->forward(other, &bo, &err), SPECINFER_OK);
  void *mixed[2] = {a, other};
  assert_int_equal(vt->forward_many(mixed, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err.message, "another k-gram table"));
  assert_int_equal(vt->kv_size(other), 4);
  unchanged();
  // A bad second batch stops the whole call, the first instance's included: a token that is not
  // a byte, a malformed batch, a batch past the context window.
  p1.tokens[2] = 300;
  assert_int_equal(vt->forward_many(ab, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err.message, "batch 1"));
  unchanged();
  p1.tokens[2] = 'f';
  bs[1].n_logits = 9;
  assert_int_equal(vt->forward_many(ab, bs, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  unchanged();
  Pass big = chain("0123456789012345678901234567890", 4, 1);  // 4 + 31 > n_ctx 32
  bs[1] = big.batch();
  assert_int_equal(vt->forward_many(ab, bs, 2, &err), SPECINFER_ERR_CONTEXT_FULL);
  assert_non_null(std::strstr(err.message, "batch 1"));
  unchanged();

  // After all that, a is where control is: the same call scores both alike.
  Pass q0 = chain(" = 1", 5, 4), q1 = chain(" = 1", 5, 4);
  specinfer_forward_batch qa = q0.batch(), qc = q1.batch();
  assert_int_equal(vt->forward_many(&a, &qa, 1, &err), SPECINFER_OK);
  assert_int_equal(vt->forward(control, &qc, &err), SPECINFER_OK);
  assert_memory_equal(q0.logits.data(), q1.logits.data(), q0.logits.size() * sizeof(float));
  vt->destroy(other);
  vt->destroy(control);
  vt->destroy(b);
  vt->destroy(a);
}

// Shares run on four threads at once (each instance on one thread), sharing and destroying as they
// go; every thread's logits equal those of a lone instance fed the same batches.
void test_shares_on_threads(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  const specinfer_target_vtable *vt = nullptr;
  void *a = create(fx, 6, 4096, &vt);
  const std::string text = "/* Opens another target on the model `target` has loaded: weights";
  auto run = [&](void *self, std::vector<float> *out) {
    specinfer_plugin_error e{};
    for (int rep = 0; rep < 20; ++rep) {
      vt->kv_truncate(self, 0, &e);
      for (size_t at = 0; at < text.size(); at += 8) {
        Pass p = chain(text.substr(at, 8), static_cast<int32_t>(at), 2);
        specinfer_forward_batch b = p.batch();
        if (vt->forward(self, &b, &e) != SPECINFER_OK) return;
        if (rep == 0) out->insert(out->end(), p.logits.begin(), p.logits.end());
      }
    }
  };
  std::vector<float> lone;
  void *l = nullptr;
  specinfer_plugin_error err{};
  assert_int_equal(vt->share(a, &l, &err), SPECINFER_OK);
  run(l, &lone);
  vt->destroy(l);
  assert_false(lone.empty());

  std::vector<std::vector<float>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      // Each thread makes its own share of a (a is only read by share) and destroys it after.
      void *mine = nullptr;
      specinfer_plugin_error e{};
      if (vt->share(a, &mine, &e) != SPECINFER_OK) return;
      run(mine, &got[static_cast<size_t>(i)]);
      vt->destroy(mine);
    });
  for (auto &th : threads) th.join();
  vt->destroy(a);
  for (auto &g : got) {
    assert_int_equal(g.size(), lone.size());
    assert_memory_equal(g.data(), lone.data(), lone.size() * sizeof(float));
  }
}

/* ---- through the public ABI ---- */

struct Api {
  specinfer_registry *reg = nullptr;
  specinfer_target *root = nullptr;
  std::string config;

  explicit Api(Fixture *fx) {
    specinfer_registry_params p;
    specinfer_registry_params_init(&p);
    p.n_threads = 2;
    assert_int_equal(specinfer_registry_create(&p, &reg, nullptr), SPECINFER_OK);
    config = "path=" + fx->corpus + ",k=6";
    char *err = nullptr;
    specinfer_status rc = specinfer_target_open(reg, "kgram", config.c_str(), &root, &err);
    if (rc != SPECINFER_OK) print_error("open kgram: %s\n", err ? err : "?");
    specinfer_free(err);
    assert_int_equal(rc, SPECINFER_OK);
  }
  ~Api() {
    specinfer_target_destroy(root);
    specinfer_registry_destroy(reg);
  }
  specinfer_target *share() const {
    specinfer_target *t = nullptr;
    assert_int_equal(specinfer_target_share(root, &t, nullptr), SPECINFER_OK);
    return t;
  }
};

struct Case {
  const char *prompt;
  bool ngram;
  float temperature;  // > 0: Gumbel-sampled at seed 7 (drafter-invariant)
};

const Case kCases[] = {{"/* Creates a session that generates with", true, 0.0f},
                       {"typedef struct specinfer_", false, 0.0f},
                       {"/* Runs one round of each", true, 0.8f}};

// A session on `t` (with an ngram drafter when asked, returned in *d) fed its prompt; NULL and
// the library's message in *error when anything fails (safe off the test thread).
specinfer_session *new_session(specinfer_registry *reg, specinfer_target *t, const Case &c,
                               const specinfer_coupler *gumbel, specinfer_drafter **d,
                               std::string *error) {
  *d = nullptr;
  char *err = nullptr;
  if (c.ngram && specinfer_drafter_open(reg, "ngram", "", t, d, &err) != SPECINFER_OK) {
    *error = std::string("ngram: ") + (err ? err : "?");
    specinfer_free(err);
    return nullptr;
  }
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.max_draft = 6;
  p.temperature = c.temperature;
  p.seed = 7;
  specinfer_session *s = nullptr;
  if (specinfer_session_create(t, *d, c.temperature > 0 ? gumbel : nullptr, &p, &s, &err) !=
      SPECINFER_OK) {
    *error = std::string("session: ") + (err ? err : "?");
    specinfer_free(err);
    return nullptr;
  }
  if (specinfer_session_feed_text(s, c.prompt, std::strlen(c.prompt)) != SPECINFER_OK) {
    *error = specinfer_session_errmsg(s);
    specinfer_session_destroy(s);
    return nullptr;
  }
  return s;
}

// The first n tokens after the prompt a session generates on its own with `t`.
std::vector<int32_t> lone_tokens(specinfer_registry *reg, specinfer_target *t, const Case &c,
                                 const specinfer_coupler *gumbel, size_t n, std::string *error) {
  specinfer_drafter *d = nullptr;
  specinfer_session *s = new_session(reg, t, c, gumbel, &d, error);
  std::vector<int32_t> out;
  int32_t buf[16];
  while (s && out.size() < n) {
    size_t got = 0;
    int32_t done = 0;
    if (specinfer_session_step(s, buf, 16, &got, &done) != SPECINFER_OK || got == 0) {
      *error = std::string("step: ") + specinfer_session_errmsg(s);
      break;
    }
    out.insert(out.end(), buf, buf + got);
  }
  specinfer_session_destroy(s);
  specinfer_drafter_destroy(d);
  out.resize(std::min(out.size(), n));
  return out;
}

// Sessions on four shares of one target at once, each thread's tokens those of a lone session.
void test_api_sessions_on_threads(void **state) {
  Api api(static_cast<Fixture *>(*state));
  specinfer_coupler *gumbel = nullptr;
  assert_int_equal(specinfer_coupler_create("gumbel", &gumbel, nullptr), SPECINFER_OK);
  const size_t n = 200;
  std::vector<specinfer_target *> t(4);
  for (auto &x : t) x = api.share();
  // Opening the same plugin and config again shares the table too (and works like a share).
  specinfer_target *again = nullptr;
  assert_int_equal(specinfer_target_open(api.reg, "kgram", api.config.c_str(), &again, nullptr),
                   SPECINFER_OK);
  std::string error;
  std::vector<std::vector<int32_t>> want(4);
  for (size_t i = 0; i < 4; ++i) {
    want[i] = lone_tokens(api.reg, again, kCases[i % 3], gumbel, n, &error);
    assert_string_equal(error.c_str(), "");
    assert_int_equal(want[i].size(), n);
  }
  assert_int_equal(specinfer_target_destroy(again), SPECINFER_OK);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      got[i] = lone_tokens(api.reg, t[i], kCases[i % 3], gumbel, n, &errors[i]);
      specinfer_target_destroy(t[i]);  // in whatever order the threads end
    });
  for (auto &th : threads) th.join();
  for (size_t i = 0; i < 4; ++i) {
    assert_string_equal(errors[i].c_str(), "");
    assert_true(got[i] == want[i]);
  }
  specinfer_coupler_destroy(gumbel);
}

// step_many of sessions on shares emits, session by session, what lone sessions emit.
void test_api_step_many(void **state) {
  Api api(static_cast<Fixture *>(*state));
  specinfer_coupler *gumbel = nullptr;
  assert_int_equal(specinfer_coupler_create("gumbel", &gumbel, nullptr), SPECINFER_OK);
  const size_t n = 120, m = 3;
  std::vector<specinfer_target *> t(m);
  std::vector<std::vector<int32_t>> want(m);
  std::string error;
  for (size_t i = 0; i < m; ++i) {
    t[i] = api.share();
    want[i] = lone_tokens(api.reg, t[i], kCases[i], gumbel, n, &error);
    assert_string_equal(error.c_str(), "");
  }
  for (const int32_t chunk : {0, 3}) {
    std::vector<specinfer_drafter *> d(m);
    std::vector<specinfer_session *> s(m);
    for (size_t i = 0; i < m; ++i) {
      s[i] = new_session(api.reg, t[i], kCases[i], gumbel, &d[i], &error);
      assert_non_null(s[i]);
    }
    specinfer_step_params params;
    specinfer_step_params_init(&params);
    params.prefill_chunk = chunk;
    std::vector<std::vector<int32_t>> got(m), room(m, std::vector<int32_t>(7));
    // What each round reports (specinfer_session_round_info), summed: it must add up to the
    // sessions' statistics.
    std::vector<int64_t> drafted(m, 0), accepted(m, 0);
    int64_t shared_rounds = 0;
    for (int calls = 0;; ++calls) {
      std::vector<specinfer_step_result> r(m);
      for (size_t i = 0; i < m; ++i) {
        r[i].struct_size = sizeof r[i];
        r[i].tokens = room[i].data();
        r[i].cap = room[i].size();
      }
      assert_int_equal(specinfer_session_step_many(s.data(), r.data(), m, &params), SPECINFER_OK);
      bool short_of = false;
      for (size_t i = 0; i < m; ++i) {
        assert_int_equal(r[i].status, SPECINFER_OK);
        got[i].insert(got[i].end(), r[i].tokens, r[i].tokens + r[i].n_tokens);
        if (r[i].n_tokens > 0) {  // a round (not a prompt chunk)
          specinfer_round_info info;
          specinfer_round_info_init(&info);
          assert_int_equal(specinfer_session_round_info(s[i], &info), SPECINFER_OK);
          assert_true(info.n_sessions >= 1 && info.n_sessions <= static_cast<int32_t>(m));
          assert_true(info.n_pass_tokens >= info.n_sessions + info.n_drafted);
          assert_true(0 <= info.n_accepted && info.n_accepted <= info.n_drafted &&
                      info.n_drafted <= info.draft_budget);
          assert_true(info.pass_ms > 0 && info.predicted_pass_ms >= 0);
          // A plan chosen for the step is never expected to be slower than plain batching.
          assert_true(info.goodput >= info.plain_goodput);
          if (info.n_sessions == 1) assert_true(info.goodput == 0);
          shared_rounds += info.n_sessions > 1;
          drafted[i] += info.n_drafted;
          accepted[i] += info.n_accepted;
        }
        short_of = short_of || got[i].size() < n;
      }
      if (!short_of) break;
      assert_true(calls < static_cast<int>(4 * n));
    }
    for (size_t i = 0; i < m; ++i) {
      got[i].resize(n);
      assert_true(got[i] == want[i]);
      specinfer_session_stats st;
      specinfer_session_stats_init(&st);
      assert_int_equal(specinfer_session_get_stats(s[i], &st), SPECINFER_OK);
      assert_int_equal(drafted[i], st.n_drafted);
      assert_int_equal(accepted[i], st.n_accepted);
    }
    assert_true(shared_rounds > 0);
    // A caller of an older, shorter struct gets its fields and nothing past them.
    specinfer_round_info older;
    std::memset(&older, 0x5a, sizeof older);
    older.struct_size = offsetof(specinfer_round_info, n_pass_tokens);
    assert_int_equal(specinfer_session_round_info(s[0], &older), SPECINFER_OK);
    assert_true(older.n_sessions >= 1 && older.n_pass_tokens == 0x5a5a5a5a);
    specinfer_round_info bad;
    specinfer_round_info_init(&bad);
    bad.struct_size = 0;
    assert_int_equal(specinfer_session_round_info(s[0], &bad), SPECINFER_ERR_INVALID_ARGUMENT);
    assert_int_equal(specinfer_session_round_info(s[0], nullptr), SPECINFER_ERR_INVALID_ARGUMENT);
    assert_int_equal(specinfer_session_round_info(nullptr, &bad), SPECINFER_ERR_INVALID_ARGUMENT);
    // Refused as a whole: a session twice; nothing runs, the message is on that session.
    size_t before = 0;
    const int32_t *toks = nullptr;
    assert_int_equal(specinfer_session_tokens(s[0], &toks, &before), SPECINFER_OK);
    specinfer_session *twice[2] = {s[0], s[0]};
    std::vector<specinfer_step_result> r(2);
    for (auto &x : r) {
      x.struct_size = sizeof x;
      x.tokens = room[0].data();
      x.cap = room[0].size();
    }
    assert_int_equal(specinfer_session_step_many(twice, r.data(), 2, &params),
                     SPECINFER_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(specinfer_session_errmsg(s[0]), "same session"));
    size_t after = 0;
    assert_int_equal(specinfer_session_tokens(s[0], &toks, &after), SPECINFER_OK);
    assert_int_equal(after, before);
    for (size_t i = 0; i < m; ++i) {
      specinfer_session_destroy(s[i]);
      specinfer_drafter_destroy(d[i]);
    }
  }
  for (auto *x : t) specinfer_target_destroy(x);
  specinfer_coupler_destroy(gumbel);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_share_and_forward_many), cmocka_unit_test(test_forward_many_errors),
      cmocka_unit_test(test_shares_on_threads),      cmocka_unit_test(test_api_sessions_on_threads),
      cmocka_unit_test(test_api_step_many),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
