/*
 * Training Medusa heads through the public ABI (specinfer_drafter_train with the medusa plugin):
 *  - on the real 0.5B model (skipped with a message when absent; SPECINFER_MODELS overrides the
 *    directory) and a few of this repository's source files, 2 heads: the call succeeds, progress
 *    goes through collect, train and evaluate, the training loss of the last epoch is below the
 *    first's, held-out accuracies are reported in [0, 1], and the heads file opens as a drafter;
 *  - reruns with fewer tokens and then the same tokens reuse the collected data (the first progress
 *    report already has every token);
 *  - with a time budget already spent, collection stops after the held-out documents and one to
 *    train on, and the training still runs and writes heads;
 *  - with a budget that stops collection partway, the whole call ends inside it (with a margin for
 *    the machine's noise; not checked when the held-out documents alone take half the budget);
 *  - a progress callback returning nonzero cancels with SPECINFER_ERR_CANCELLED;
 *  - an unknown config key is refused with SPECINFER_ERR_CONFIG.
 * Lighter with SPECINFER_SANITIZED=1.
 */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "support/models.h"
#include "support/test_util.h"

static char g_model[4096];

static int have_model(void) {
  return model_path("qwen2.5-coder-0.5b.gguf", g_model, sizeof g_model);
}

/* What the progress callback saw. */
typedef struct {
  int collect_reports, train_reports, eval_reports;
  int64_t first_collect_done, collect_total, last_collect_done;
  double epoch_loss[64]; /* training loss reported with each epoch's evaluation (index = epoch) */
  int n_epochs;
  float accuracy[16];
  int n_heads;
  int bad; /* malformed reports */
  int cancel_at_first;
  int64_t mandatory;     /* tokens collected whatever the budget: the held-out ones */
  double mandatory_done; /* seconds (now_seconds) when a report first passed them; 0 = never */
} seen_t;

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int on_progress(void *user, const specinfer_train_progress *p) {
  seen_t *s = user;
  if (!p || p->struct_size < sizeof *p || !p->stage || p->done < 0 || p->done > p->total) {
    s->bad++;
    return 0;
  }
  if (strcmp(p->stage, "collect") == 0) {
    if (s->collect_reports++ == 0) s->first_collect_done = p->done;
    if (p->done < s->last_collect_done) s->bad++;
    s->last_collect_done = p->done;
    if (s->mandatory > 0 && p->done > s->mandatory && s->mandatory_done == 0)
      s->mandatory_done = now_seconds();
    s->collect_total = p->total;
    if (s->cancel_at_first) return 1;
  } else if (strcmp(p->stage, "train") == 0) {
    s->train_reports++;
    if (isnan(p->loss) && p->done > 1) s->bad++;
  } else if (strcmp(p->stage, "evaluate") == 0) {
    s->eval_reports++;
    if (!p->accuracy || p->n_heads < 1 || p->n_heads > 16) {
      s->bad++;
      return 0;
    }
    s->n_heads = p->n_heads;
    for (int k = 0; k < p->n_heads; ++k) {
      if (!(p->accuracy[k] >= 0.0f && p->accuracy[k] <= 1.0f)) s->bad++;
      s->accuracy[k] = p->accuracy[k];
    }
    if (p->done >= 1 && p->done < 64) {
      s->epoch_loss[p->done] = p->loss;
      if (p->done > s->n_epochs) s->n_epochs = (int)p->done;
    }
  } else {
    s->bad++;
  }
  return 0;
}

static const char *const kCorpus[] = {"lib/session/session.cpp", "lib/coupling/rejection.cpp",
                                      "lib/sampling/sampler.cpp", "plugins/kgram/kgram_model.cpp",
                                      "plugins/ngram/plugin_entry.cpp"};
enum { kNCorpus = sizeof kCorpus / sizeof kCorpus[0] };

typedef struct {
  specinfer_registry *reg;
  specinfer_target *target;
  char corpus_buf[kNCorpus][4096];
  const char *corpus[kNCorpus];
  char out[256];
} fixture;

static int setup(void **state) {
  if (!have_model()) {
    fprintf(stderr, "SKIP: %s not found (run scripts/fetch-models)\n", g_model);
    *state = NULL;
    return 0;
  }
  fixture *fx = calloc(1, sizeof *fx);
  fx->reg = new_registry();
  char cfg[4200];
  snprintf(cfg, sizeof cfg, "path=%s,n_ctx=512", g_model);
  char *err = NULL;
  specinfer_status rc = specinfer_target_open(fx->reg, "gguf", cfg, &fx->target, &err);
  if (rc != SPECINFER_OK) fprintf(stderr, "open target: %s\n", err ? err : "?");
  specinfer_free(err);
  if (rc != SPECINFER_OK) return -1;
  for (int i = 0; i < kNCorpus; ++i) {
    snprintf(fx->corpus_buf[i], sizeof fx->corpus_buf[i], "%s", source_path(kCorpus[i]));
    fx->corpus[i] = fx->corpus_buf[i];
  }
  snprintf(fx->out, sizeof fx->out, "/tmp/test_medusa_train_%d.gguf", (int)getpid());
  *state = fx;
  return 0;
}

static void remove_outputs(const fixture *fx) {
  char path[300];
  unlink(fx->out);
  snprintf(path, sizeof path, "%s.data", fx->out);
  unlink(path);
  snprintf(path, sizeof path, "%s.ckpt", fx->out);
  unlink(path);
}

static int teardown(void **state) {
  fixture *fx = *state;
  if (!fx) return 0;
  remove_outputs(fx);
  specinfer_target_destroy(fx->target);
  specinfer_registry_destroy(fx->reg);
  free(fx);
  return 0;
}

/* The training config, with `tokens` corpus tokens (0: the test's default). */
static const char *train_config(int tokens) {
  static char buf[256];
  const int sanitized = getenv("SPECINFER_SANITIZED") != NULL;
  snprintf(buf, sizeof buf, "%s,tokens=%d",
           sanitized ? "heads=2,heldout=256,chunk=128,vocab=512,epochs=3,batch=32,lr=0.002"
                     : "heads=2,heldout=512,chunk=256,vocab=1024,epochs=3,batch=64,lr=0.002",
           tokens      ? tokens
           : sanitized ? 768
                       : 3072);
  return buf;
}

static specinfer_status train(fixture *fx, const char *config, seen_t *seen, char **err) {
  specinfer_train_params p;
  specinfer_train_params_init(&p);
  p.config = config;
  p.corpus = fx->corpus;
  p.n_corpus = kNCorpus;
  p.out_path = fx->out;
  p.progress = on_progress;
  p.user = seen;
  return specinfer_drafter_train(fx->reg, "medusa", fx->target, &p, err);
}

static void test_train_and_resume(void **state) {
  fixture *fx = *state;
  if (!fx) skip();
  remove_outputs(fx);
  seen_t seen;
  memset(&seen, 0, sizeof seen);
  char *err = NULL;
  specinfer_status rc = train(fx, train_config(0), &seen, &err);
  if (rc != SPECINFER_OK) fprintf(stderr, "train: %s\n", err ? err : "?");
  assert_int_equal(rc, SPECINFER_OK);
  assert_null(err);
  assert_int_equal(seen.bad, 0);
  assert_true(seen.collect_reports >= 2);
  assert_int_equal(seen.first_collect_done, 0);
  assert_true(seen.collect_total > 0);
  assert_true(seen.last_collect_done == seen.collect_total);
  assert_true(seen.train_reports > 0);
  assert_int_equal(seen.n_epochs, 3);
  assert_int_equal(seen.n_heads, 2);
  fprintf(stderr, "training loss by epoch: %.4f %.4f %.4f; held-out top-1: %.3f %.3f\n",
          seen.epoch_loss[1], seen.epoch_loss[2], seen.epoch_loss[3], seen.accuracy[0],
          seen.accuracy[1]);
  assert_true(seen.epoch_loss[3] < seen.epoch_loss[1]);
  struct stat st;
  assert_int_equal(stat(fx->out, &st), 0);

  /* The heads file opens as a drafter for this target. */
  char cfg[300];
  snprintf(cfg, sizeof cfg, "path=%s", fx->out);
  specinfer_drafter *d = open_drafter(fx->reg, fx->target, "medusa", cfg);
  specinfer_drafter_destroy(d);

  /* A rerun with fewer tokens finds them all collected, and leaves the rest of the collected
   * data for a rerun with the first run's tokens. */
  const int fewer = getenv("SPECINFER_SANITIZED") ? 600 : 2000;
  for (int i = 0; i < 2; ++i) {
    memset(&seen, 0, sizeof seen);
    rc = train(fx, train_config(i == 0 ? fewer : 0), &seen, &err);
    if (rc != SPECINFER_OK) fprintf(stderr, "train again: %s\n", err ? err : "?");
    assert_int_equal(rc, SPECINFER_OK);
    assert_true(seen.collect_reports >= 1);
    assert_true(seen.first_collect_done == seen.collect_total);
    assert_int_equal(seen.n_epochs, 3);
  }
}

static void test_time_budget(void **state) {
  fixture *fx = *state;
  if (!fx) skip();
  remove_outputs(fx);
  seen_t seen;
  memset(&seen, 0, sizeof seen);
  char config[300];
  snprintf(config, sizeof config, "%s,minutes=0.0001", train_config(0));
  char *err = NULL;
  specinfer_status rc = train(fx, config, &seen, &err);
  if (rc != SPECINFER_OK) fprintf(stderr, "train: %s\n", err ? err : "?");
  assert_int_equal(rc, SPECINFER_OK);
  assert_int_equal(seen.bad, 0);
  fprintf(stderr, "time budget: collected %lld of %lld tokens\n", (long long)seen.last_collect_done,
          (long long)seen.collect_total);
  assert_true(seen.last_collect_done > 0);
  assert_true(seen.last_collect_done < seen.collect_total);
  assert_int_equal(seen.n_epochs, 3);
  struct stat st;
  assert_int_equal(stat(fx->out, &st), 0);
  remove_outputs(fx);
}

static void test_budget_is_kept(void **state) {
  fixture *fx = *state;
  if (!fx) skip();
  if (getenv("SPECINFER_SANITIZED")) {
    fprintf(stderr, "SKIP: timing under the sanitizers says nothing about the budget\n");
    skip();
  }
  remove_outputs(fx);
  const double budget = 12.0;
  seen_t seen;
  memset(&seen, 0, sizeof seen);
  seen.mandatory = 256; /* heldout */
  const char *config =
      "heads=2,heldout=256,chunk=256,vocab=1024,epochs=3,batch=64,tokens=65536,minutes=0.2";
  char *err = NULL;
  const double t0 = now_seconds();
  specinfer_status rc = train(fx, config, &seen, &err);
  const double elapsed = now_seconds() - t0;
  if (rc != SPECINFER_OK) fprintf(stderr, "train: %s\n", err ? err : "?");
  assert_int_equal(rc, SPECINFER_OK);
  assert_int_equal(seen.bad, 0);
  fprintf(stderr, "budget %.0f s: collected %lld of %lld tokens, the call took %.1f s\n", budget,
          (long long)seen.last_collect_done, (long long)seen.collect_total, elapsed);
  /* The corpus holds more than 12 s of collection on the machines this runs on. */
  assert_true(seen.last_collect_done < seen.collect_total);
  assert_true(seen.mandatory_done > 0);
  if (seen.mandatory_done - t0 > 0.5 * budget) {
    fprintf(stderr, "SKIP: the held-out documents took %.1f s of the %.0f s budget\n",
            seen.mandatory_done - t0, budget);
  } else {
    assert_true(elapsed <= 1.3 * budget + 2.0);
  }
  remove_outputs(fx);
}

static void test_cancel_and_config(void **state) {
  fixture *fx = *state;
  if (!fx) skip();
  remove_outputs(fx);
  seen_t seen;
  memset(&seen, 0, sizeof seen);
  seen.cancel_at_first = 1;
  char *err = NULL;
  assert_int_equal(train(fx, train_config(0), &seen, &err), SPECINFER_ERR_CANCELLED);
  assert_non_null(err);
  assert_non_null(strstr(err, "cancel"));
  specinfer_free(err);
  err = NULL;
  struct stat st;
  assert_int_not_equal(stat(fx->out, &st), 0); /* nothing written */

  memset(&seen, 0, sizeof seen);
  assert_int_equal(train(fx, "heads=2,no_such_key=1", &seen, &err), SPECINFER_ERR_CONFIG);
  assert_non_null(err);
  assert_non_null(strstr(err, "no_such_key"));
  specinfer_free(err);
  err = NULL;
  assert_int_equal(train(fx, "heads=0", &seen, &err), SPECINFER_ERR_CONFIG);
  specinfer_free(err);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_train_and_resume),
      cmocka_unit_test(test_time_budget),
      cmocka_unit_test(test_budget_is_kept),
      cmocka_unit_test(test_cancel_and_config),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
