/* Foundation tests through the public ABI: versions and statuses, misuse, the plugin loader
 * (wrong ABI, not a plugin, load/unload cycles, in-process registration), sessions on the kgram
 * target, and greedy speculative output == plain greedy output. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specinfer.h"
#include "specinfer_plugin.h"

#include "support/test_util.h"

#define CORPUS "abi/specinfer.h"

/* ---- versions and statuses ---- */

static void test_version(void **state) {
  (void)state;
  assert_int_equal(specinfer_version_number(), SPECINFER_VERSION_NUMBER);
  assert_string_equal(specinfer_version_string(), SPECINFER_VERSION_STRING);
  assert_string_equal(specinfer_status_str(SPECINFER_OK), "SPECINFER_OK");
  assert_string_equal(specinfer_status_str(SPECINFER_ERR_ABI_MISMATCH),
                      "SPECINFER_ERR_ABI_MISMATCH");
  assert_string_equal(specinfer_status_str(12345), "SPECINFER_UNKNOWN_STATUS");
  assert_string_equal(specinfer_status_str(-1), "SPECINFER_UNKNOWN_STATUS");
  for (int s = SPECINFER_OK; s <= SPECINFER_ERR_INTERNAL; ++s)
    assert_string_not_equal(specinfer_status_str(s), "SPECINFER_UNKNOWN_STATUS");
}

/* ---- misuse ---- */

static void test_null_handles(void **state) {
  (void)state;
  char *err = NULL;
  assert_int_equal(specinfer_registry_create(NULL, NULL, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(err);
  specinfer_free(err);
  assert_int_equal(specinfer_registry_destroy(NULL), SPECINFER_OK);
  assert_int_equal(specinfer_registry_load_plugin(NULL, "x", NULL), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_registry_plugin_count(NULL), 0);
  assert_int_equal(specinfer_target_destroy(NULL), SPECINFER_OK);
  assert_int_equal(specinfer_drafter_destroy(NULL), SPECINFER_OK);
  specinfer_session_destroy(NULL);
  specinfer_coupler_destroy(NULL);
  specinfer_free(NULL);
  specinfer_target *t = (specinfer_target *)1;
  assert_int_equal(specinfer_target_open(NULL, "kgram", "", &t, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_null(t);
  specinfer_free(err);
  specinfer_session *s = NULL;
  assert_int_equal(specinfer_session_create(NULL, NULL, NULL, NULL, &s, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(err);
  specinfer_free(err);
  assert_int_equal(specinfer_session_feed_text(NULL, "a", 1), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_generate(NULL, 1, NULL, NULL), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_reset(NULL), SPECINFER_ERR_INVALID_ARGUMENT);
  specinfer_session_stats st;
  specinfer_session_stats_init(&st);
  assert_int_equal(specinfer_session_get_stats(NULL, &st), SPECINFER_ERR_INVALID_ARGUMENT);
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  assert_int_equal(specinfer_target_info(NULL, &info), SPECINFER_ERR_INVALID_ARGUMENT);
  size_t n = 0;
  assert_int_equal(specinfer_target_tokenize(NULL, "a", 1, 0, 0, NULL, 0, &n),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_string_equal(specinfer_session_errmsg(NULL), "session is NULL");
}

static void test_bad_params(void **state) {
  (void)state;
  specinfer_registry_params p;
  specinfer_registry_params_init(&p);
  p.struct_size = 0;
  specinfer_registry *reg = NULL;
  char *err = NULL;
  assert_int_equal(specinfer_registry_create(&p, &reg, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_null(reg);
  assert_non_null(strstr(err, "struct_size"));
  specinfer_free(err);

  reg = new_registry();
  specinfer_target *t = open_kgram(reg, CORPUS, 4);
  specinfer_session_params sp;
  specinfer_session_params_init(&sp);
  specinfer_session *s = NULL;
  sp.temperature = -1.0f;
  assert_int_equal(specinfer_session_create(t, NULL, NULL, &sp, &s, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err, "temperature"));
  specinfer_free(err);
  specinfer_session_params_init(&sp);
  sp.max_draft = 1000;
  assert_int_equal(specinfer_session_create(t, NULL, NULL, &sp, &s, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  specinfer_free(err);
  specinfer_session_params_init(&sp);
  sp.top_p = 0.0f;
  assert_int_equal(specinfer_session_create(t, NULL, NULL, &sp, &s, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  specinfer_free(err);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

static void test_unknown_plugin_and_config(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  specinfer_target *t = NULL;
  char *err = NULL;
  assert_int_equal(specinfer_target_open(reg, "no-such-plugin", "", &t, &err),
                   SPECINFER_ERR_NOT_FOUND);
  assert_non_null(strstr(err, "no-such-plugin"));
  specinfer_free(err);
  assert_int_equal(specinfer_target_open(reg, "../etc/passwd", "", &t, &err),
                   SPECINFER_ERR_NOT_FOUND);
  specinfer_free(err);
  /* An unknown config key is refused, and the message names it. */
  char cfg[4300];
  snprintf(cfg, sizeof cfg, "%s,colour=blue", kgram_config(CORPUS, "k=3"));
  assert_int_equal(specinfer_target_open(reg, "kgram", cfg, &t, &err), SPECINFER_ERR_CONFIG);
  assert_non_null(strstr(err, "colour"));
  specinfer_free(err);
  assert_int_equal(specinfer_target_open(reg, "kgram", kgram_config(CORPUS, "k=99"), &t, &err),
                   SPECINFER_ERR_CONFIG);
  specinfer_free(err);
  assert_int_equal(specinfer_target_open(reg, "kgram", "path=/nonexistent/file.txt", &t, &err),
                   SPECINFER_ERR_NOT_FOUND);
  assert_non_null(strstr(err, "/nonexistent/file.txt"));
  specinfer_free(err);
  assert_int_equal(specinfer_target_open(reg, "kgram", "k=3", &t, &err), SPECINFER_ERR_CONFIG);
  specinfer_free(err);
  assert_int_equal(specinfer_target_open(reg, "kgram", "garbage", &t, &err), SPECINFER_ERR_CONFIG);
  specinfer_free(err);
  /* ngram is a drafter only. */
  assert_int_equal(specinfer_target_open(reg, "ngram", "", &t, &err), SPECINFER_ERR_NOT_FOUND);
  assert_non_null(strstr(err, "drafter"));
  specinfer_free(err);
  /* The drafter side checks its config too. */
  specinfer_target *target = open_kgram(reg, CORPUS, 4);
  specinfer_drafter *d = NULL;
  assert_int_equal(specinfer_drafter_open(reg, "ngram", "n_min=5,n_max=2", target, &d, &err),
                   SPECINFER_ERR_CONFIG);
  specinfer_free(err);
  assert_int_equal(specinfer_drafter_open(reg, "ngram", "bogus=1", target, &d, &err),
                   SPECINFER_ERR_CONFIG);
  assert_non_null(strstr(err, "bogus"));
  specinfer_free(err);
  assert_null(d);
  assert_int_equal(specinfer_target_destroy(target), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

/* Runs a greedy session on t over `prompt`, 16 tokens; its text into out (the number of tokens)
 * and its target passes into *passes. */
static size_t run_session(specinfer_target *t, const char *prompt, int32_t *out, size_t cap,
                          int64_t *passes) {
  specinfer_session *s = NULL;
  assert_int_equal(specinfer_session_create(t, NULL, NULL, NULL, &s, NULL), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, prompt, strlen(prompt)), SPECINFER_OK);
  assert_int_equal(specinfer_session_generate(s, 16, NULL, NULL), SPECINFER_OK);
  specinfer_session_stats st;
  specinfer_session_stats_init(&st);
  assert_int_equal(specinfer_session_get_stats(s, &st), SPECINFER_OK);
  *passes = st.n_target_passes;
  const int32_t *toks = NULL;
  size_t n = 0;
  assert_int_equal(specinfer_session_tokens(s, &toks, &n), SPECINFER_OK);
  assert_true(n <= cap);
  memcpy(out, toks, n * sizeof *out);
  specinfer_session_destroy(s);
  return n;
}

/* A session starts from what the last session on its target left in the cache: the prefix its
 * text shares with that one is not scored again (one catch-up pass of 512 tokens fewer for a
 * prompt of 1,200 bytes that continues the last text), and its text is the one an empty cache
 * gives. A cache changed since (specinfer_target_eval) is not trusted: scored again. */
static void test_next_session_keeps_shared_prefix(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  specinfer_target *t = open_kgram(reg, CORPUS, 4);
  specinfer_target *fresh = open_kgram(reg, CORPUS, 4);
  char first[1101], second[1200];
  for (size_t i = 0; i < 1100; ++i) first[i] = (char)('a' + (i * 7 + i / 13) % 26);
  first[1100] = 0;
  snprintf(second, sizeof second, "%s and then some more", first);
  int32_t a[1400], b[1400], c[1400], d[1400];
  int64_t passes_first = 0, passes_reused = 0, passes_fresh = 0, passes_changed = 0;
  run_session(t, first, a, 1400, &passes_first);
  const size_t nb = run_session(t, second, b, 1400, &passes_reused);
  const size_t nc = run_session(fresh, second, c, 1400, &passes_fresh);
  assert_int_equal(nb, nc);
  assert_memory_equal(b, c, nb * sizeof *b);
  /* Fresh: three catch-up passes (512 + 512 + 95) and 16 rounds; reused: the 20 new bytes. */
  assert_int_equal(passes_fresh, passes_reused + 2);
  /* An eval between sessions that writes other tokens from position 100 on. */
  int32_t cached = 0;
  assert_int_equal(specinfer_target_eval(t, NULL, &cached), SPECINFER_OK);
  assert_true(cached > 1100);
  const int32_t other[4] = {'z', 'z', 'z', 'z'};
  specinfer_eval_params ep;
  specinfer_eval_params_init(&ep);
  ep.n_past = 100;
  ep.tokens = other;
  ep.n_tokens = 4;
  assert_int_equal(specinfer_target_eval(t, &ep, NULL), SPECINFER_OK);
  const size_t nd = run_session(t, second, d, 1400, &passes_changed);
  assert_int_equal(nd, nc);
  assert_memory_equal(d, c, nd * sizeof *d);
  assert_int_equal(passes_changed, passes_fresh);
  (void)passes_first;
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_target_destroy(fresh), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

static void test_wrong_abi_plugin(void **state) {
  (void)state;
  const char *dir = getenv("SPECINFER_TEST_PLUGINS");
  assert_non_null(dir);
  char path[4096];
  specinfer_registry *reg = new_registry();
  char *err = NULL;
  snprintf(path, sizeof path, "%s/test_plugin_bad_abi.so", dir);
  assert_int_equal(specinfer_registry_load_plugin(reg, path, &err), SPECINFER_ERR_ABI_MISMATCH);
  /* The message names both versions. */
  assert_non_null(strstr(err, "99"));
  char mine[64];
  snprintf(mine, sizeof mine, "plugin ABI version %u", SPECINFER_PLUGIN_ABI_VERSION);
  assert_non_null(strstr(err, mine));
  specinfer_free(err);
  snprintf(path, sizeof path, "%s/test_plugin_no_entry.so", dir);
  assert_int_equal(specinfer_registry_load_plugin(reg, path, &err), SPECINFER_ERR_FORMAT);
  assert_non_null(strstr(err, "specinfer_plugin_entry"));
  specinfer_free(err);
  assert_int_equal(specinfer_registry_load_plugin(reg, "/nonexistent/plugin.so", &err),
                   SPECINFER_ERR_NOT_FOUND);
  specinfer_free(err);
  /* A file that is not a shared object at all. */
  assert_int_equal(specinfer_registry_load_plugin(reg, source_path(CORPUS), &err),
                   SPECINFER_ERR_IO);
  specinfer_free(err);
  assert_int_equal(specinfer_registry_plugin_count(reg), 0);
  /* Loading a directory skips the bad ones. */
  int32_t n = -1;
  assert_int_equal(specinfer_registry_load_dir(reg, dir, &n, &err), SPECINFER_OK);
  assert_int_equal(n, 0);
  assert_int_equal(specinfer_registry_load_dir(reg, "/nonexistent-dir", &n, &err),
                   SPECINFER_ERR_NOT_FOUND);
  specinfer_free(err);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

static void test_load_unload_cycles(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  char *err = NULL;
  for (int i = 0; i < 25; ++i) {
    specinfer_target *t =
        open_kgram(reg, CORPUS, 2); /* loads specinfer-kgram.so from the plugin path */
    assert_int_equal(specinfer_registry_plugin_count(reg), 1);
    specinfer_plugin_info info;
    info.struct_size = sizeof info;
    assert_int_equal(specinfer_registry_plugin_info(reg, 0, &info), SPECINFER_OK);
    assert_string_equal(info.name, "kgram");
    assert_true(info.has_target && info.has_drafter);
    assert_int_equal(specinfer_registry_plugin_info(reg, 1, &info), SPECINFER_ERR_INVALID_ARGUMENT);
    /* In use: cannot unload, cannot destroy the registry. */
    assert_int_equal(specinfer_registry_unload_plugin(reg, "kgram", &err), SPECINFER_ERR_STATE);
    specinfer_free(err);
    assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_ERR_STATE);
    assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
    assert_int_equal(specinfer_registry_unload_plugin(reg, "kgram", &err), SPECINFER_OK);
    assert_int_equal(specinfer_registry_plugin_count(reg), 0);
  }
  assert_int_equal(specinfer_registry_unload_plugin(reg, "kgram", &err), SPECINFER_ERR_NOT_FOUND);
  specinfer_free(err);
  /* Loading the same plugin twice is refused. */
  char path[4096];
  const char *pp = getenv("SPECINFER_PLUGIN_PATH");
  snprintf(path, sizeof path, "%s/specinfer-ngram.so", pp);
  assert_int_equal(specinfer_registry_load_plugin(reg, path, &err), SPECINFER_OK);
  assert_int_equal(specinfer_registry_load_plugin(reg, path, &err), SPECINFER_ERR_STATE);
  specinfer_free(err);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

/* ---- sessions ---- */

typedef struct {
  char text[65536];
  size_t len;
  int calls;
  int stop_after;
  int chunks_valid_utf8; /* every chunk handed over was whole UTF-8 on its own */
} sink;

static int valid_utf8(const unsigned char *s, size_t n);

static int collect(void *user, const int32_t *tokens, size_t n, const char *text, size_t len) {
  sink *s = (sink *)user;
  (void)tokens;
  assert_true(n >= 1);
  if (s->len + len < sizeof s->text) {
    memcpy(s->text + s->len, text, len);
    s->len += len;
  }
  s->calls++;
  if (s->calls == 1) s->chunks_valid_utf8 = 1;
  if (!valid_utf8((const unsigned char *)text, len)) s->chunks_valid_utf8 = 0;
  return s->stop_after && s->calls >= s->stop_after;
}

/* Generates with (target, drafter) greedily; returns the whole token sequence (caller frees). */
static int32_t *generate(specinfer_target *t, specinfer_drafter *d, const char *prompt, int n,
                         int max_draft, int adaptive, size_t *n_out, specinfer_session_stats *st) {
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.max_draft = max_draft;
  p.adaptive_draft = adaptive;
  specinfer_session *s = NULL;
  char *err = NULL;
  assert_int_equal(specinfer_session_create(t, d, NULL, &p, &s, &err), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, prompt, strlen(prompt)), SPECINFER_OK);
  assert_int_equal(specinfer_session_generate(s, n, NULL, NULL), SPECINFER_OK);
  const int32_t *toks = NULL;
  assert_int_equal(specinfer_session_tokens(s, &toks, n_out), SPECINFER_OK);
  int32_t *copy = malloc(*n_out * sizeof(int32_t));
  memcpy(copy, toks, *n_out * sizeof(int32_t));
  if (st) {
    specinfer_session_stats_init(st);
    assert_int_equal(specinfer_session_get_stats(s, st), SPECINFER_OK);
  }
  specinfer_session_destroy(s);
  return copy;
}

static void test_greedy_speculative_equals_plain(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  specinfer_target *t = open_kgram(reg, CORPUS, 6);
  char *err = NULL;
  specinfer_drafter *ngram = NULL, *k2 = NULL, *k3 = NULL;
  assert_int_equal(specinfer_drafter_open(reg, "ngram", "n_max=3", t, &ngram, &err), SPECINFER_OK);
  assert_int_equal(specinfer_drafter_open(reg, "kgram", kgram_config(CORPUS, "k=2"), t, &k2, &err),
                   SPECINFER_OK);
  assert_int_equal(specinfer_drafter_open(reg, "kgram", kgram_config(CORPUS, "k=3"), t, &k3, &err),
                   SPECINFER_OK);
  const char *prompts[] = {"SPECINFER_API specinfer_status specinfer_", "/* Creates a ",
                           "typedef struct", "x", "The session borrows all three; they must "};
  specinfer_drafter *drafters[] = {ngram, k2, k3};
  for (size_t i = 0; i < sizeof prompts / sizeof *prompts; ++i) {
    size_t n_plain = 0;
    int32_t *plain = generate(t, NULL, prompts[i], 300, 8, 1, &n_plain, NULL);
    assert_true(n_plain == strlen(prompts[i]) + 300);
    for (size_t j = 0; j < 3; ++j) {
      for (int adaptive = 0; adaptive <= 1; ++adaptive) {
        size_t n_spec = 0;
        specinfer_session_stats st;
        int32_t *spec =
            generate(t, drafters[j], prompts[i], 300, 1 + (int)(i + j) % 8, adaptive, &n_spec, &st);
        assert_int_equal(n_spec, n_plain);
        assert_memory_equal(spec, plain, n_plain * sizeof(int32_t));
        /* Accounting: every round emits accepted + 1 tokens. */
        assert_int_equal(st.n_generated, 300);
        assert_int_equal(st.n_generated, st.n_accepted + st.n_rounds);
        assert_true(st.n_accepted <= st.n_drafted);
        assert_true(st.n_target_passes >= st.n_rounds);
        free(spec);
      }
    }
    free(plain);
  }
  assert_int_equal(specinfer_drafter_destroy(ngram), SPECINFER_OK);
  assert_int_equal(specinfer_drafter_destroy(k2), SPECINFER_OK);
  assert_int_equal(specinfer_drafter_destroy(k3), SPECINFER_OK);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

static void test_session_state_errors(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  specinfer_target *t = open_kgram(reg, CORPUS, 3);
  specinfer_session *s = NULL, *s2 = NULL;
  char *err = NULL;
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  assert_int_equal(specinfer_session_create(t, NULL, NULL, &p, &s, &err), SPECINFER_OK);
  /* One session per target. */
  assert_int_equal(specinfer_session_create(t, NULL, NULL, &p, &s2, &err), SPECINFER_ERR_STATE);
  specinfer_free(err);
  /* A target in use is not destroyed. */
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_ERR_STATE);
  /* Nothing fed yet. */
  assert_int_equal(specinfer_session_generate(s, 5, NULL, NULL), SPECINFER_ERR_STATE);
  assert_non_null(strstr(specinfer_session_errmsg(s), "feed"));
  int32_t bad[2] = {65, 256};
  assert_int_equal(specinfer_session_feed_tokens(s, bad, 2), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_feed_tokens(s, NULL, 3), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_feed_text(s, "", 0), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, "ab", 2), SPECINFER_OK);
  int32_t out[16];
  size_t n = 0;
  int32_t done = 0;
  assert_int_equal(specinfer_session_step(s, out, 0, &n, &done), SPECINFER_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(specinfer_session_step(s, out, 16, &n, &done), SPECINFER_OK);
  assert_int_equal(n, 1);
  assert_int_equal(specinfer_session_generate(s, -1, NULL, NULL), SPECINFER_ERR_INVALID_ARGUMENT);
  /* Cancellation from the callback. */
  sink *k = calloc(1, sizeof *k);
  k->stop_after = 2;
  assert_int_equal(specinfer_session_generate(s, 50, collect, k), SPECINFER_ERR_CANCELLED);
  assert_int_equal(k->calls, 2);
  free(k);
  specinfer_session_destroy(s);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);

  /* A context window that fills up. */
  specinfer_target *small = NULL;
  assert_int_equal(
      specinfer_target_open(reg, "kgram", kgram_config(CORPUS, "k=3,n_ctx=32"), &small, &err),
      SPECINFER_OK);
  assert_int_equal(specinfer_session_create(small, NULL, NULL, &p, &s, &err), SPECINFER_OK);
  char big[40];
  memset(big, 'a', sizeof big);
  assert_int_equal(specinfer_session_feed_text(s, big, sizeof big), SPECINFER_ERR_CONTEXT_FULL);
  assert_int_equal(specinfer_session_feed_text(s, big, 10), SPECINFER_OK);
  assert_int_equal(specinfer_session_generate(s, 100, NULL, NULL), SPECINFER_ERR_CONTEXT_FULL);
  const int32_t *toks = NULL;
  assert_int_equal(specinfer_session_tokens(s, &toks, &n), SPECINFER_OK);
  assert_int_equal(n, 32);
  specinfer_session_destroy(s);
  assert_int_equal(specinfer_target_destroy(small), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

static int valid_utf8(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || i + len > n) return 0;
    for (size_t j = 1; j < len; ++j)
      if ((s[i + j] & 0xC0) != 0x80) return 0;
    i += len;
  }
  return 1;
}

static void test_streaming_utf8(void **state) {
  (void)state;
  /* Train on text full of multi-byte characters; every chunk handed to the callback must be whole
   * UTF-8, and the chunks together must equal the generated bytes. */
  char path[] = "/tmp/specinfer-utf8-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  for (int i = 0; i < 200; ++i)
    fputs(
        "Grüße aus Köln — 東京は晴れ、気温は２５度。Ünïcödé ✓ 🙂 naïve "
        "café; ",
        f);
  fclose(f);
  specinfer_registry *reg = new_registry();
  char cfg[4200];
  snprintf(cfg, sizeof cfg, "path=%s,k=5", path);
  specinfer_target *t = NULL;
  char *err = NULL;
  assert_int_equal(specinfer_target_open(reg, "kgram", cfg, &t, &err), SPECINFER_OK);
  specinfer_drafter *d = NULL;
  assert_int_equal(specinfer_drafter_open(reg, "ngram", "", t, &d, &err), SPECINFER_OK);
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.max_draft = 5;
  specinfer_session *s = NULL;
  assert_int_equal(specinfer_session_create(t, d, NULL, &p, &s, &err), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, "東京", strlen("東京")), SPECINFER_OK);
  sink *k = calloc(1, sizeof *k);
  assert_int_equal(specinfer_session_generate(s, 400, collect, k), SPECINFER_OK);
  assert_true(k->calls > 10);
  assert_true(k->chunks_valid_utf8);
  assert_true(valid_utf8((const unsigned char *)k->text, k->len));
  const int32_t *toks = NULL;
  size_t n = 0;
  specinfer_session_tokens(s, &toks, &n);
  size_t prompt = strlen("東京");
  /* The text delivered is a prefix of the generated bytes, short of at most one held character. */
  assert_true(k->len <= n - prompt && k->len + 4 > n - prompt);
  for (size_t i = 0; i < k->len; ++i) assert_int_equal((unsigned char)k->text[i], toks[prompt + i]);
  free(k);
  specinfer_session_destroy(s);
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
  remove(path);
}

/* ---- an in-process drafter: proposes the last token again, max_tokens times ---- */

static int g_begins, g_commits;
static void rep_destroy(void *self) {
  free(self);
}
static specinfer_status rep_begin(void *self, const int32_t *ctx, size_t n,
                                  specinfer_plugin_error *err) {
  (void)self;
  (void)ctx;
  (void)n;
  (void)err;
  g_begins++;
  return SPECINFER_OK;
}
static specinfer_status rep_propose(void *self, const specinfer_draft_request *req,
                                    specinfer_draft *out, specinfer_plugin_error *err) {
  (void)self;
  (void)err;
  int32_t last = req->context[req->n_context - 1];
  int32_t n = req->max_tokens < out->cap ? req->max_tokens : out->cap;
  for (int32_t i = 0; i < n; ++i) {
    out->tokens[i] = last;
    out->parents[i] = i - 1;
  }
  out->n_nodes = n;
  out->has_probs = 0;
  return SPECINFER_OK;
}
static specinfer_status rep_commit(void *self, const int32_t *t, size_t n,
                                   specinfer_plugin_error *err) {
  (void)self;
  (void)t;
  (void)n;
  (void)err;
  g_commits++;
  return SPECINFER_OK;
}
static const specinfer_drafter_vtable rep_vtable = {
    sizeof(specinfer_drafter_vtable), rep_destroy, rep_begin, rep_propose, rep_commit, NULL};
static specinfer_status rep_create(const specinfer_host *host, const char *config,
                                   const specinfer_model_info *ti,
                                   const specinfer_host_target *target, void **self,
                                   const specinfer_drafter_vtable **vt,
                                   specinfer_plugin_error *err) {
  (void)ti;
  (void)target;
  if (config && *config) {
    snprintf(err->message, sizeof err->message, "repeat takes no config, got '%s'", config);
    return SPECINFER_ERR_CONFIG;
  }
  assert_non_null(host->kernels);
  assert_int_equal(host->abi_version, SPECINFER_PLUGIN_ABI_VERSION);
  *self = malloc(1);
  *vt = &rep_vtable;
  return SPECINFER_OK;
}
TEST_DRAFTER_PLUGIN(rep, "repeat", "in-process test drafter", rep_create);

static void test_in_process_drafter(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  char *err = NULL;
  assert_int_equal(specinfer_registry_register_plugin(reg, &rep_plugin, &err), SPECINFER_OK);
  assert_int_equal(specinfer_registry_register_plugin(reg, &rep_plugin, &err), SPECINFER_ERR_STATE);
  specinfer_free(err);
  specinfer_plugin_descriptor bad = rep_plugin;
  bad.abi_version = 0;
  bad.name = "repeat2";
  assert_int_equal(specinfer_registry_register_plugin(reg, &bad, &err), SPECINFER_ERR_ABI_MISMATCH);
  specinfer_free(err);
  bad.abi_version = SPECINFER_PLUGIN_ABI_VERSION;
  bad.name = "bad name!";
  assert_int_equal(specinfer_registry_register_plugin(reg, &bad, &err), SPECINFER_ERR_FORMAT);
  specinfer_free(err);

  specinfer_target *t = open_kgram(reg, CORPUS, 5);
  specinfer_drafter *d = NULL;
  assert_int_equal(specinfer_drafter_open(reg, "repeat", "x=1", t, &d, &err), SPECINFER_ERR_CONFIG);
  assert_non_null(strstr(err, "x=1"));
  specinfer_free(err);
  assert_int_equal(specinfer_drafter_open(reg, "repeat", "", t, &d, &err), SPECINFER_OK);
  const char *prompt = "/**************************************************************";
  size_t n_plain = 0, n_spec = 0;
  int32_t *plain = generate(t, NULL, prompt, 200, 8, 1, &n_plain, NULL);
  g_begins = g_commits = 0;
  specinfer_session_stats st;
  int32_t *spec = generate(t, d, prompt, 200, 6, 0, &n_spec, &st);
  assert_int_equal(n_spec, n_plain);
  assert_memory_equal(spec, plain, n_plain * sizeof(int32_t));
  assert_int_equal(g_begins, 1);
  assert_true(g_commits >= 1);
  assert_true(st.n_accepted > 0); /* runs of '*' are accepted */
  free(plain);
  free(spec);
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

static void test_tokenize_detokenize(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  specinfer_target *t = open_kgram(reg, CORPUS, 3);
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  assert_int_equal(specinfer_target_info(t, &info), SPECINFER_OK);
  assert_int_equal(info.vocab_size, 256);
  assert_string_equal(info.arch, "kgram");
  int32_t ids[8];
  size_t n = 0;
  assert_int_equal(specinfer_target_tokenize(t, "hello, world", 12, 1, 1, ids, 8, &n),
                   SPECINFER_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(n, 12);
  assert_int_equal(specinfer_target_tokenize(t, "héllo", 6, 1, 1, ids, 8, &n), SPECINFER_OK);
  assert_int_equal(n, 6);
  char text[8];
  size_t nb = 0;
  assert_int_equal(specinfer_target_detokenize(t, ids, n, text, 3, &nb),
                   SPECINFER_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(nb, 6);
  assert_int_equal(specinfer_target_detokenize(t, ids, n, text, 8, &nb), SPECINFER_OK);
  assert_memory_equal(text, "héllo", 6);
  int32_t bad = 300;
  assert_int_equal(specinfer_target_detokenize(t, &bad, 1, text, 8, &nb),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_true(strlen(specinfer_target_errmsg(t)) > 0);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

/* ---- threads ---- */

struct open_job {
  specinfer_registry *reg;
  const char *config;
  specinfer_target *t;
  specinfer_status rc;
  char *err;
};

static void *open_kgram_thread(void *arg) {
  struct open_job *j = arg;
  j->rc = specinfer_target_open(j->reg, "kgram", j->config, &j->t, &j->err);
  return NULL;
}

/* Several threads opening the same plugin that no one has loaded yet (it comes from the plugin
 * path on first use): every open succeeds (the registry loads it once). The config string is made
 * once here: kgram_config returns a static buffer, which the threads must not rewrite. */
static void test_concurrent_autoload(void **state) {
  (void)state;
  char config[4200];
  snprintf(config, sizeof config, "%s", kgram_config(CORPUS, "k=3"));
  for (int rep = 0; rep < 16; ++rep) {
    specinfer_registry *reg = new_registry();
    struct open_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; ++i) {
      jobs[i] = (struct open_job){reg, config, NULL, SPECINFER_ERR_INTERNAL, NULL};
      assert_int_equal(pthread_create(&th[i], NULL, open_kgram_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; ++i) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 4; ++i) {
      if (jobs[i].rc != SPECINFER_OK)
        fprintf(stderr, "thread %d: %s\n", i, jobs[i].err ? jobs[i].err : "?");
      assert_int_equal(jobs[i].rc, SPECINFER_OK);
      specinfer_free(jobs[i].err);
      assert_int_equal(specinfer_target_destroy(jobs[i].t), SPECINFER_OK);
    }
    assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_null_handles),
      cmocka_unit_test(test_bad_params),
      cmocka_unit_test(test_unknown_plugin_and_config),
      cmocka_unit_test(test_wrong_abi_plugin),
      cmocka_unit_test(test_load_unload_cycles),
      cmocka_unit_test(test_greedy_speculative_equals_plain),
      cmocka_unit_test(test_session_state_errors),
      cmocka_unit_test(test_streaming_utf8),
      cmocka_unit_test(test_in_process_drafter),
      cmocka_unit_test(test_tokenize_detokenize),
      cmocka_unit_test(test_concurrent_autoload),
      cmocka_unit_test(test_next_session_keeps_shared_prefix),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
