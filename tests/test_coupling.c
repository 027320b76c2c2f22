/* Black-box tests of the couplers through the C ABI: exactness (chi-square of the emitted tokens
 * against the target's distribution over 10^5 draws), acceptance rates (within 4 sigma of their
 * closed forms), the match probability of the communication-free couplers, drafter invariance,
 * tree verification, and bad input.
 *
 * All randomness is fixed: the couplers take a fixed seed, and the test's own draws (i.i.d. tree
 * children) come from a seeded splitmix64. Chi-square statistics are compared with the critical
 * value at significance 1e-6 (Wilson-Hilferty), rates with 4 standard deviations. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specinfer.h"

#include "support/cmocka_setup.h"

#define V 8
#define N_DRAWS 100000
#define SEED 0x5eed1234abcdULL

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static uint64_t rng_state;
static void rng_seed(uint64_t s) {
  rng_state = s;
}
static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
static double rng_uniform(void) {
  return ((double)(rng_next() >> 11) + 0.5) * 0x1.0p-53;
}
static int32_t rng_pick(const float *w, int n) {
  double u = rng_uniform(), acc = 0;
  int last = -1;
  for (int i = 0; i < n; ++i) {
    if (w[i] <= 0) continue;
    acc += w[i];
    last = i;
    if (acc > u) return i;
  }
  return last;
}

static specinfer_coupler *make(const char *spec) {
  specinfer_coupler *c = NULL;
  char *err = NULL;
  specinfer_status rc = specinfer_coupler_create(spec, &c, &err);
  if (rc != SPECINFER_OK) fprintf(stderr, "create %s: %s\n", spec, err ? err : "?");
  assert_int_equal(rc, SPECINFER_OK);
  assert_null(err);
  assert_non_null(c);
  return c;
}

static void normalize(float *w, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += w[i];
  for (int i = 0; i < n; ++i) w[i] = (float)(w[i] / s);
}

/* Chi-square critical value at significance 1e-6 (z = 4.753), Wilson-Hilferty approximation. */
static double chi2_crit(int df) {
  double a = 2.0 / (9.0 * df), c = 1.0 - a + 4.753 * sqrt(a);
  return df * c * c * c;
}

/* Observed counts against probabilities: no count where the probability is 0, and the
 * chi-square statistic over the other cells below the critical value. */
static void check_marginal(const long *counts, const float *probs, int n, long total,
                           const char *label) {
  double stat = 0;
  int df = -1;
  for (int i = 0; i < n; ++i) {
    if (probs[i] <= 0) {
      if (counts[i] != 0)
        fprintf(stderr, "%s: %ld draws of token %d, which has p = 0\n", label, counts[i], i);
      assert_int_equal(counts[i], 0);
      continue;
    }
    double e = (double)probs[i] * (double)total;
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++df;
  }
  if (df <= 0) return;
  double crit = chi2_crit(df);
  printf("  %-40s chi2 = %8.2f (df %d, critical %.2f)\n", label, stat, df, crit);
  assert_true(stat < crit);
}

/* A rate against its expected value, within 4 binomial standard deviations. */
static void check_rate(long hits, long n, double expect, const char *label) {
  double rate = (double)hits / (double)n;
  double e = fmin(1.0, fmax(0.0, expect)); /* float rows may put sum min(p, q) a hair above 1 */
  double sigma = sqrt(e * (1.0 - e) / (double)n);
  printf("  %-40s rate = %.5f expected %.5f (4 sigma = %.5f)\n", label, rate, expect, 4 * sigma);
  assert_true(fabs(rate - e) <= 4.0 * sigma + 1e-9);
}

static double sum_min(const float *p, const float *q, double scale_p) {
  double s = 0;
  for (int i = 0; i < V; ++i) s += fmin(p[i] / scale_p, q[i]);
  return s;
}
static double tv_distance(const float *p, const float *q) {
  double s = 0;
  for (int i = 0; i < V; ++i) s += fabs((double)p[i] - (double)q[i]);
  return s / 2;
}

/* p/q pairs over V = 8 tokens. */
typedef struct {
  const char *name;
  float p[V];
  float q[V];
} Pair;

static Pair pairs[] = {
    {"overlap", {30, 20, 15, 10, 10, 8, 5, 2}, {5, 10, 30, 5, 20, 10, 10, 10}},
    {"disjoint supports", {50, 30, 20, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 25, 25, 25, 25}},
    {"close", {20, 20, 15, 15, 10, 10, 5, 5}, {22, 18, 15, 14, 11, 9, 6, 5}},
    {"point-mass target", {0, 0, 1, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 1, 1}},
    {"point-mass draft q", {30, 20, 15, 10, 10, 8, 5, 2}, {0, 0, 0, 0, 0, 1, 0, 0}},
    {"sparse", {0, 40, 0, 30, 0, 20, 0, 10}, {25, 25, 25, 25, 0, 0, 0, 0}},
};
#define N_PAIRS ((int)(sizeof pairs / sizeof pairs[0]))

static int setup(void **state) {
  (void)state;
  static int done = 0;
  if (!done) {
    for (int i = 0; i < N_PAIRS; ++i) {
      normalize(pairs[i].p, V);
      normalize(pairs[i].q, V);
    }
    done = 1;
  }
  return 0;
}

/* One chain step with k = 1: draft (from q with the coupler's draft side, or the point mass
 * `fixed` when q is NULL), verify, and return the emitted first token. */
static int32_t step1(const specinfer_coupler *c, const float *p, const float *q, int32_t fixed,
                     uint64_t seed, int64_t pos, int32_t *accepted) {
  float p2[2 * V];
  memcpy(p2, p, sizeof(float) * V);
  memcpy(p2 + V, p, sizeof(float) * V);
  int32_t d = fixed;
  if (q)
    assert_int_equal(specinfer_coupler_draft_sample(c, V, q, V, seed, pos, &d, NULL), SPECINFER_OK);
  int32_t acc = -1, tok = -1;
  assert_int_equal(
      specinfer_coupler_verify(c, V, 1, p2, 2 * V, q, q ? V : 0, &d, seed, pos, &acc, &tok, NULL),
      SPECINFER_OK);
  assert_true(acc == 0 || acc == 1);
  assert_true(tok >= 0 && tok < V);
  *accepted = acc;
  return acc ? d : tok;
}

/* ---------------------------------------------------------------------------------------------
 * Rejection: exact marginal, acceptance sum min(p, q)
 * ------------------------------------------------------------------------------------------- */

static void test_rejection_marginal_and_acceptance(void **state) {
  (void)state;
  specinfer_coupler *c = make("rejection");
  assert_string_equal(specinfer_coupler_name(c), "rejection");
  assert_int_equal(specinfer_coupler_is_exact(c), 1);
  for (int k = 0; k < N_PAIRS; ++k) {
    const Pair *pr = &pairs[k];
    long counts[V] = {0}, acc_total = 0;
    for (long n = 0; n < N_DRAWS; ++n) {
      int32_t acc;
      counts[step1(c, pr->p, pr->q, -1, SEED + (uint64_t)k, 3 * n + 1, &acc)]++;
      acc_total += acc;
    }
    char label[96];
    snprintf(label, sizeof label, "rejection %s: marginal", pr->name);
    check_marginal(counts, pr->p, V, N_DRAWS, label);
    snprintf(label, sizeof label, "rejection %s: acceptance", pr->name);
    check_rate(acc_total, N_DRAWS, sum_min(pr->p, pr->q, 1.0), label);
  }
  specinfer_coupler_destroy(c);
}

/* A deterministic drafter (q = NULL): token x is kept with probability p(x); still exact. */
static void test_rejection_point_mass_drafts(void **state) {
  (void)state;
  specinfer_coupler *c = make("rejection");
  const Pair *pr = &pairs[0];
  const int32_t xs[] = {0, 6};
  for (int j = 0; j < 2; ++j) {
    long counts[V] = {0}, acc_total = 0;
    for (long n = 0; n < N_DRAWS; ++n) {
      int32_t acc;
      counts[step1(c, pr->p, NULL, xs[j], SEED ^ 77, 5 * n, &acc)]++;
      acc_total += acc;
    }
    char label[96];
    snprintf(label, sizeof label, "rejection point mass on %d: marginal", xs[j]);
    check_marginal(counts, pr->p, V, N_DRAWS, label);
    snprintf(label, sizeof label, "rejection point mass on %d: acceptance", xs[j]);
    check_rate(acc_total, N_DRAWS, pr->p[xs[j]], label);
  }
  /* A point-mass target refuses every other token for sure. */
  long acc_total = 0;
  for (long n = 0; n < 1000; ++n) {
    int32_t acc;
    assert_int_equal(step1(c, pairs[3].p, NULL, 1, SEED, n, &acc), 2);
    acc_total += acc;
  }
  assert_int_equal(acc_total, 0);
  specinfer_coupler_destroy(c);
}

/* ---------------------------------------------------------------------------------------------
 * A Markov target and drafter over 5 tokens: whole generated sequences, produced round by round
 * like a session does (drafting k tokens, verifying, keeping the accepted prefix plus one), must
 * be distributed as the target's. Used for chains, trees and drafter invariance.
 * ------------------------------------------------------------------------------------------- */

#define MV 5
#define SEQ 3
static float P[MV][MV], Q1[MV][MV], Q2[MV][MV];

static void markov_setup(void) {
  rng_seed(99);
  for (int a = 0; a < MV; ++a) {
    for (int b = 0; b < MV; ++b) {
      P[a][b] = (float)(0.25 + rng_uniform());
      Q1[a][b] = (float)(0.05 + rng_uniform() * rng_uniform());
      Q2[a][b] = (a + b) % 3 == 0 ? 0.0f : (float)(0.2 + rng_uniform());
    }
    normalize(P[a], MV);
    normalize(Q1[a], MV);
    normalize(Q2[a], MV);
  }
}

typedef enum { DRAFT_NONE, DRAFT_SAMPLED, DRAFT_ARGMAX } DraftKind;

/* Generates SEQ tokens after token 0 with chains of up to k drafted tokens from Q (DRAFT_SAMPLED:
 * the coupler's draft side; DRAFT_ARGMAX: a deterministic drafter, q = NULL). Sequence `s` uses
 * positions s * 64 + t. Returns the number of rounds; *accepted_total counts kept drafts. */
static int generate_chain(const specinfer_coupler *c, float Q[MV][MV], DraftKind kind, int k,
                          uint64_t seed, long s, int32_t *out, long *accepted_total) {
  int n = 0, rounds = 0;
  int32_t prev = 0;
  while (n < SEQ) {
    int32_t draft[8];
    float p[9 * MV], q[8 * MV];
    int kk = kind == DRAFT_NONE ? 0 : k;
    int32_t last = prev;
    for (int i = 0; i < kk; ++i) {
      int64_t pos = s * 64 + n + i;
      if (kind == DRAFT_SAMPLED) {
        memcpy(q + i * MV, Q[last], sizeof(float) * MV);
        assert_int_equal(
            specinfer_coupler_draft_sample(c, MV, Q[last], MV, seed, pos, &draft[i], NULL),
            SPECINFER_OK);
      } else {
        int32_t best = 0;
        for (int j = 1; j < MV; ++j)
          if (Q[last][j] > Q[last][best]) best = j;
        draft[i] = best;
      }
      last = draft[i];
    }
    last = prev;
    for (int i = 0; i <= kk; ++i) {
      memcpy(p + i * MV, P[last], sizeof(float) * MV);
      if (i < kk) last = draft[i];
    }
    int32_t acc = -1, tok = -1;
    const float *qq = kind == DRAFT_SAMPLED ? q : NULL;
    assert_int_equal(
        specinfer_coupler_verify(c, MV, kk, p, (size_t)(kk + 1) * MV, qq, qq ? (size_t)kk * MV : 0,
                                 draft, seed, s * 64 + n, &acc, &tok, NULL),
        SPECINFER_OK);
    assert_true(acc >= 0 && acc <= kk);
    for (int i = 0; i < acc && n < SEQ; ++i) out[n++] = draft[i];
    if (n < SEQ) out[n++] = tok;
    if (accepted_total) *accepted_total += acc;
    prev = out[n - 1];
    ++rounds;
  }
  return rounds;
}

static int seq_index(const int32_t *t) {
  return (t[0] * MV + t[1]) * MV + t[2];
}

static void seq_expected(float *e) {
  for (int a = 0; a < MV; ++a)
    for (int b = 0; b < MV; ++b)
      for (int c = 0; c < MV; ++c) e[(a * MV + b) * MV + c] = P[0][a] * P[a][b] * P[b][c];
}

static void check_chain_joint(const char *spec, float Q[MV][MV], DraftKind kind, int k) {
  specinfer_coupler *c = make(spec);
  static long counts[MV * MV * MV];
  static float expect[MV * MV * MV];
  memset(counts, 0, sizeof counts);
  seq_expected(expect);
  long accepted = 0;
  for (long s = 0; s < N_DRAWS; ++s) {
    int32_t seq[SEQ];
    generate_chain(c, Q, kind, k, SEED, s, seq, &accepted);
    counts[seq_index(seq)]++;
  }
  char label[96];
  snprintf(label, sizeof label, "%s chain k=%d (%s): joint of 3", spec, k,
           kind == DRAFT_SAMPLED  ? "sampled"
           : kind == DRAFT_ARGMAX ? "argmax"
                                  : "none");
  check_marginal(counts, expect, MV * MV * MV, N_DRAWS, label);
  specinfer_coupler_destroy(c);
}

static void test_chain_sequences_exact(void **state) {
  (void)state;
  markov_setup();
  check_chain_joint("rejection", Q1, DRAFT_SAMPLED, 3);
  check_chain_joint("rejection", Q2, DRAFT_SAMPLED, 2);
  check_chain_joint("rejection", Q1, DRAFT_ARGMAX, 3);
  check_chain_joint("gumbel", Q1, DRAFT_SAMPLED, 3);
  check_chain_joint("minhash", Q2, DRAFT_SAMPLED, 3);
}

/* Gumbel and MinHash: the same seed gives the same text whatever the drafter, and the same as
 * plain decoding (k = 0). */
static void test_race_drafter_invariance(void **state) {
  (void)state;
  markov_setup();
  const char *specs[] = {"gumbel", "minhash"};
  for (int si = 0; si < 2; ++si) {
    specinfer_coupler *c = make(specs[si]);
    long differ = 0, accepted = 0;
    for (long s = 0; s < 20000; ++s) {
      int32_t plain[SEQ], a[SEQ], b[SEQ], d[SEQ], e[SEQ];
      generate_chain(c, Q1, DRAFT_NONE, 0, SEED, s, plain, NULL);
      generate_chain(c, Q1, DRAFT_SAMPLED, 3, SEED, s, a, &accepted);
      generate_chain(c, Q2, DRAFT_SAMPLED, 2, SEED, s, b, &accepted);
      generate_chain(c, Q1, DRAFT_ARGMAX, 3, SEED, s, d, &accepted);
      generate_chain(c, Q2, DRAFT_SAMPLED, 1, SEED, s, e, &accepted);
      differ += memcmp(plain, a, sizeof plain) != 0 || memcmp(plain, b, sizeof plain) != 0 ||
                memcmp(plain, d, sizeof plain) != 0 || memcmp(plain, e, sizeof plain) != 0;
    }
    printf("  %-40s %ld of 20000 sequences differ; %ld drafts kept\n", specs[si], differ, accepted);
    assert_int_equal(differ, 0);
    assert_true(accepted > 1000); /* the drafts were not all refused: the test has teeth */
    /* A different seed gives a different text (for most sequences). */
    long same = 0;
    for (long s = 0; s < 2000; ++s) {
      int32_t x[SEQ], y[SEQ];
      generate_chain(c, Q1, DRAFT_NONE, 0, SEED, s, x, NULL);
      generate_chain(c, Q1, DRAFT_NONE, 0, SEED + 1, s, y, NULL);
      same += memcmp(x, y, sizeof x) == 0;
    }
    assert_true(same < 1000);
    specinfer_coupler_destroy(c);
  }
}

/* ---------------------------------------------------------------------------------------------
 * Gumbel and MinHash: exact marginals, Pr[a = b] >= (1 - D) / (1 + D), gumbel >= minhash
 * ------------------------------------------------------------------------------------------- */

/* Pr[a = b] of the Gumbel coupling in closed form: sum_i 1 / sum_j max(p_j / p_i, q_j / q_i). */
static double gumbel_match_exact(const float *p, const float *q) {
  double total = 0;
  for (int i = 0; i < V; ++i) {
    if (p[i] <= 0 || q[i] <= 0) continue;
    double s = 0;
    for (int j = 0; j < V; ++j) s += fmax((double)p[j] / p[i], (double)q[j] / q[i]);
    total += 1.0 / s;
  }
  return total;
}

static void test_race_marginals_and_match(void **state) {
  (void)state;
  specinfer_coupler *g = make("gumbel"), *m = make("minhash");
  assert_int_equal(specinfer_coupler_is_exact(g), 1);
  assert_int_equal(specinfer_coupler_is_exact(m), 1);
  for (int k = 0; k < N_PAIRS; ++k) {
    const Pair *pr = &pairs[k];
    long match[2] = {0, 0};
    for (int which = 0; which < 2; ++which) {
      const specinfer_coupler *c = which ? m : g;
      long cp[V] = {0}, cq[V] = {0};
      for (long n = 0; n < N_DRAWS; ++n) {
        int32_t acc, d;
        int64_t pos = 2 * n + 11;
        assert_int_equal(specinfer_coupler_draft_sample(c, V, pr->q, V, SEED, pos, &d, NULL),
                         SPECINFER_OK);
        cq[d]++;
        cp[step1(c, pr->p, pr->q, -1, SEED, pos, &acc)]++;
        match[which] += acc;
      }
      char label[96];
      snprintf(label, sizeof label, "%s %s: target marginal", which ? "minhash" : "gumbel",
               pr->name);
      check_marginal(cp, pr->p, V, N_DRAWS, label);
      snprintf(label, sizeof label, "%s %s: draft marginal", which ? "minhash" : "gumbel",
               pr->name);
      check_marginal(cq, pr->q, V, N_DRAWS, label);
    }
    double D = tv_distance(pr->p, pr->q), bound = (1 - D) / (1 + D);
    double rg = (double)match[0] / N_DRAWS, rm = (double)match[1] / N_DRAWS;
    double sg = sqrt(rg * (1 - rg) / N_DRAWS), sm = sqrt(rm * (1 - rm) / N_DRAWS);
    printf("  %-20s D = %.4f bound %.4f  gumbel %.4f (exact %.4f)  minhash %.4f\n", pr->name, D,
           bound, rg, gumbel_match_exact(pr->p, pr->q), rm);
    assert_true(rg >= bound - 4 * sg - 1e-12);
    assert_true(rm >= bound - 4 * sm - 1e-12);
    assert_true(rg >= rm - 4 * (sg + sm) - 1e-12);
    char label[96];
    snprintf(label, sizeof label, "gumbel %s: Pr[a = b]", pr->name);
    check_rate(match[0], N_DRAWS, gumbel_match_exact(pr->p, pr->q), label);
  }
  specinfer_coupler_destroy(g);
  specinfer_coupler_destroy(m);
}

/* ---------------------------------------------------------------------------------------------
 * Lenient, typical, greedy
 * ------------------------------------------------------------------------------------------- */

static void test_lenient_acceptance(void **state) {
  (void)state;
  const char *specs[] = {"lenient:0.5", "lenient:0.8"};
  const double ls[] = {0.5, 0.8};
  for (int j = 0; j < 2; ++j) {
    specinfer_coupler *c = make(specs[j]);
    assert_string_equal(specinfer_coupler_name(c), specs[j]);
    assert_int_equal(specinfer_coupler_is_exact(c), 0);
    for (int k = 0; k < N_PAIRS; ++k) {
      const Pair *pr = &pairs[k];
      long acc_total = 0;
      for (long n = 0; n < N_DRAWS / 2; ++n) {
        int32_t acc;
        step1(c, pr->p, pr->q, -1, SEED, n, &acc);
        acc_total += acc;
      }
      char label[96];
      snprintf(label, sizeof label, "%s %s: acceptance", specs[j], pr->name);
      check_rate(acc_total, N_DRAWS / 2, sum_min(pr->p, pr->q, ls[j]), label);
    }
    specinfer_coupler_destroy(c);
  }
  specinfer_coupler *one = make("lenient:1");
  assert_string_equal(specinfer_coupler_name(one), "rejection");
  assert_int_equal(specinfer_coupler_is_exact(one), 1);
  specinfer_coupler_destroy(one);
}

static void test_typical_rule(void **state) {
  (void)state;
  specinfer_coupler *c = make("typical");
  assert_string_equal(specinfer_coupler_name(c), "typical:0.09:0.3");
  assert_int_equal(specinfer_coupler_is_exact(c), 0);
  specinfer_coupler *c2 = make("typical:0.2:0.1");
  const specinfer_coupler *cs[] = {c, c2};
  const double eps[] = {0.09, 0.2}, delta[] = {0.3, 0.1};
  rng_seed(7);
  long kept = 0, refused = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    float p[2 * V];
    double skew = 1 + 6 * rng_uniform();
    for (int i = 0; i < V; ++i) p[i] = (float)pow(rng_uniform(), skew);
    normalize(p, V);
    memcpy(p + V, p, sizeof(float) * V);
    double h = 0;
    for (int i = 0; i < V; ++i)
      if (p[i] > 0) h -= p[i] * log(p[i]);
    int which = trial & 1;
    int32_t x = (int32_t)(rng_next() % V), acc = -1, tok = -1;
    assert_int_equal(specinfer_coupler_verify(cs[which], V, 1, p, 2 * V, NULL, 0, &x, SEED, trial,
                                              &acc, &tok, NULL),
                     SPECINFER_OK);
    int expect = p[x] > fmin(eps[which], delta[which] * exp(-h));
    assert_int_equal(acc, expect);
    kept += acc;
    refused += !acc;
  }
  assert_true(kept > 100 && refused > 100);
  specinfer_coupler_destroy(c);
  specinfer_coupler_destroy(c2);
}

static void test_greedy(void **state) {
  (void)state;
  specinfer_coupler *c = make("greedy");
  assert_int_equal(specinfer_coupler_is_exact(c), 1);
  float p[4 * V];
  const int32_t best[4] = {3, 1, 6, 0};
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < V; ++i) p[r * V + i] = 0.05f;
    p[r * V + best[r]] = 1.0f - 0.05f * (V - 1);
  }
  int32_t acc, tok;
  int32_t d1[3] = {3, 1, 6};
  assert_int_equal(specinfer_coupler_verify(c, V, 3, p, 4 * V, NULL, 0, d1, 1, 0, &acc, &tok, NULL),
                   SPECINFER_OK);
  assert_int_equal(acc, 3);
  assert_int_equal(tok, 0);
  int32_t d2[3] = {3, 2, 6};
  assert_int_equal(specinfer_coupler_verify(c, V, 3, p, 4 * V, NULL, 0, d2, 1, 0, &acc, &tok, NULL),
                   SPECINFER_OK);
  assert_int_equal(acc, 1);
  assert_int_equal(tok, 1);
  int32_t d;
  assert_int_equal(specinfer_coupler_draft_sample(c, V, p + 2 * V, V, 9, 9, &d, NULL),
                   SPECINFER_OK);
  assert_int_equal(d, 6);
  specinfer_coupler_destroy(c);
}

/* ---------------------------------------------------------------------------------------------
 * Tokens per round with an i.i.d. drafter: every position has target p and draft q, so each
 * draft is kept with probability alpha = sum min(p, q) independently and a round of k drafts
 * emits (1 - alpha^(k+1)) / (1 - alpha) tokens on average.
 * ------------------------------------------------------------------------------------------- */

static void test_tokens_per_round_iid(void **state) {
  (void)state;
  const char *specs[] = {"rejection", "gumbel"};
  for (int si = 0; si < 2; ++si) {
    specinfer_coupler *c = make(specs[si]);
    const Pair *pr = &pairs[0];
    const int k = 4;
    float p[(k + 1) * V], q[k * V];
    for (int i = 0; i <= k; ++i) memcpy(p + i * V, pr->p, sizeof(float) * V);
    for (int i = 0; i < k; ++i) memcpy(q + i * V, pr->q, sizeof(float) * V);
    const long rounds = 50000;
    double sum = 0, sum2 = 0;
    int64_t pos = 0;
    for (long r = 0; r < rounds; ++r) {
      int32_t d[4], acc, tok;
      for (int i = 0; i < k; ++i)
        assert_int_equal(specinfer_coupler_draft_sample(c, V, q, V, SEED, pos + i, &d[i], NULL),
                         SPECINFER_OK);
      assert_int_equal(
          specinfer_coupler_verify(c, V, k, p, sizeof p / sizeof *p, q, sizeof q / sizeof *q, d,
                                   SEED, pos, &acc, &tok, NULL),
          SPECINFER_OK);
      double emitted = acc + 1;
      sum += emitted;
      sum2 += emitted * emitted;
      pos += acc + 1;
    }
    double mean = sum / rounds, var = sum2 / rounds - mean * mean;
    double alpha = si == 0 ? sum_min(pr->p, pr->q, 1.0) : gumbel_match_exact(pr->p, pr->q);
    double expect = (1 - pow(alpha, k + 1)) / (1 - alpha);
    double tol = 4 * sqrt(var / rounds);
    printf("  %-40s tokens/round %.4f expected %.4f (alpha %.4f, 4 sigma %.4f)\n", specs[si], mean,
           expect, alpha, tol);
    assert_true(fabs(mean - expect) <= tol);
    specinfer_coupler_destroy(c);
  }
}

/* ---------------------------------------------------------------------------------------------
 * Trees
 * ------------------------------------------------------------------------------------------- */

/* One node with m children drawn i.i.d. from q (the test's own randomness): the first emitted
 * token is distributed as p (SpecInfer's multi-step speculative sampling). */
static void test_tree_mss_marginal(void **state) {
  (void)state;
  specinfer_coupler *c = make("rejection");
  rng_seed(1234);
  for (int k = 0; k < N_PAIRS; ++k) {
    const Pair *pr = &pairs[k];
    for (int m = 2; m <= 3; ++m) {
      long counts[V] = {0}, acc_total = 0;
      float p[4 * V], q[3 * V];
      for (int j = 0; j <= m; ++j) memcpy(p + j * V, pr->p, sizeof(float) * V);
      for (int j = 0; j < m; ++j) memcpy(q + j * V, pr->q, sizeof(float) * V);
      int32_t parents[3] = {-1, -1, -1}, tokens[3], path[3], acc, tok;
      for (long n = 0; n < N_DRAWS; ++n) {
        for (int j = 0; j < m; ++j) tokens[j] = rng_pick(pr->q, V);
        assert_int_equal(
            specinfer_coupler_verify_tree(c, V, m, tokens, parents, p, (size_t)(m + 1) * V, q,
                                          (size_t)m * V, SEED, n, path, 3, &acc, &tok, NULL),
            SPECINFER_OK);
        assert_true(acc == 0 || acc == 1);
        counts[acc ? tokens[path[0]] : tok]++;
        acc_total += acc;
      }
      char label[96];
      snprintf(label, sizeof label, "tree %d children %s: marginal", m, pr->name);
      check_marginal(counts, pr->p, V, N_DRAWS, label);
      /* More children never accept less often than one (sum min(p, q)). */
      double one = sum_min(pr->p, pr->q, 1.0);
      double s1 = sqrt(one * (1 - one) / N_DRAWS);
      assert_true((double)acc_total / N_DRAWS >= one - 4 * s1 - 1e-12);
    }
  }
  /* Point-mass children (distinct candidate tokens, q = NULL): still exact. */
  const Pair *pr = &pairs[0];
  long counts[V] = {0};
  float p[4 * V];
  for (int j = 0; j < 4; ++j) memcpy(p + j * V, pr->p, sizeof(float) * V);
  int32_t parents[3] = {-1, -1, -1}, tokens[3] = {4, 0, 7}, path[3], acc, tok;
  long acc_total = 0;
  for (long n = 0; n < N_DRAWS; ++n) {
    assert_int_equal(specinfer_coupler_verify_tree(c, V, 3, tokens, parents, p, 4 * V, NULL, 0,
                                                   SEED, n, path, 3, &acc, &tok, NULL),
                     SPECINFER_OK);
    counts[acc ? tokens[path[0]] : tok]++;
    acc_total += acc;
  }
  check_marginal(counts, pr->p, V, N_DRAWS, "tree point-mass children {4,0,7}: marginal");
  check_rate(acc_total, N_DRAWS, (double)pr->p[4] + pr->p[0] + pr->p[7],
             "tree point-mass children: acceptance");
  specinfer_coupler_destroy(c);
}

/* Depth-2 trees (2 children per node, i.i.d. from the Markov drafter) over the Markov target: the
 * generated sequences are distributed as the target's. Nodes: 0, 1 children of the root; 2, 3
 * children of 0; 4, 5 children of 1. */
static void generate_tree(const specinfer_coupler *c, uint64_t seed, long s, int32_t *out,
                          long *accepted) {
  int n = 0;
  int32_t prev = 0;
  static const int32_t parents[6] = {-1, -1, 0, 0, 1, 1};
  while (n < SEQ) {
    int32_t tokens[6], path[6], acc, tok;
    float p[7 * MV], q[6 * MV];
    for (int j = 0; j < 6; ++j) {
      int32_t ctx = parents[j] < 0 ? prev : tokens[parents[j]];
      memcpy(q + j * MV, Q1[ctx], sizeof(float) * MV);
      tokens[j] = rng_pick(Q1[ctx], MV);
    }
    memcpy(p, P[prev], sizeof(float) * MV);
    for (int j = 0; j < 6; ++j) memcpy(p + (j + 1) * MV, P[tokens[j]], sizeof(float) * MV);
    assert_int_equal(specinfer_coupler_verify_tree(c, MV, 6, tokens, parents, p, 7 * MV, q, 6 * MV,
                                                   seed, s * 64 + n, path, 6, &acc, &tok, NULL),
                     SPECINFER_OK);
    assert_true(acc >= 0 && acc <= 2);
    for (int i = 0; i < acc; ++i) {
      if (i > 0) assert_int_equal(parents[path[i]], path[i - 1]);
      if (n < SEQ) out[n++] = tokens[path[i]];
    }
    if (acc > 0) assert_int_equal(parents[path[0]], -1);
    if (n < SEQ) out[n++] = tok;
    *accepted += acc;
    prev = out[n - 1];
  }
}

static void test_tree_sequences_exact(void **state) {
  (void)state;
  markov_setup();
  const char *specs[] = {"rejection", "gumbel"};
  static long counts[MV * MV * MV];
  static float expect[MV * MV * MV];
  seq_expected(expect);
  for (int si = 0; si < 2; ++si) {
    specinfer_coupler *c = make(specs[si]);
    memset(counts, 0, sizeof counts);
    rng_seed(4321);
    long accepted = 0;
    for (long s = 0; s < N_DRAWS; ++s) {
      int32_t seq[SEQ];
      generate_tree(c, SEED, s, seq, &accepted);
      counts[seq_index(seq)]++;
    }
    char label[96];
    snprintf(label, sizeof label, "%s depth-2 tree: joint of 3", specs[si]);
    check_marginal(counts, expect, MV * MV * MV, N_DRAWS, label);
    assert_true(accepted > N_DRAWS / 2);
    /* Gumbel trees emit the plain-decoding text too. */
    if (si == 1) {
      rng_seed(4321);
      for (long s = 0; s < 2000; ++s) {
        int32_t a[SEQ], b[SEQ];
        long dummy = 0;
        generate_tree(c, SEED, s, a, &dummy);
        generate_chain(c, Q1, DRAFT_NONE, 0, SEED, s, b, NULL);
        assert_memory_equal(a, b, sizeof a);
      }
    }
    specinfer_coupler_destroy(c);
  }
}

/* A chain given as a tree gives exactly what verify gives, for every coupler. */
static void test_tree_chain_equals_verify(void **state) {
  (void)state;
  const char *specs[] = {"greedy", "rejection", "lenient:0.6", "gumbel", "minhash", "typical"};
  rng_seed(55);
  for (int si = 0; si < 6; ++si) {
    specinfer_coupler *c = make(specs[si]);
    for (int trial = 0; trial < 3000; ++trial) {
      const int k = 1 + (int)(rng_next() % 4);
      float p[5 * V], q[4 * V];
      int32_t d[4], parents[4], path[4];
      for (int r = 0; r < k + 1; ++r) {
        const Pair *pr = &pairs[rng_next() % N_PAIRS];
        memcpy(p + r * V, pr->p, sizeof(float) * V);
        if (r < k) {
          memcpy(q + r * V, pr->q, sizeof(float) * V);
          d[r] = rng_pick(pr->q, V);
          parents[r] = r - 1;
        }
      }
      int use_q = trial & 1;
      int32_t a1, t1, a2, t2;
      assert_int_equal(
          specinfer_coupler_verify(c, V, k, p, (size_t)(k + 1) * V, use_q ? q : NULL,
                                   use_q ? (size_t)k * V : 0, d, SEED, trial, &a1, &t1, NULL),
          SPECINFER_OK);
      assert_int_equal(specinfer_coupler_verify_tree(c, V, k, d, parents, p, (size_t)(k + 1) * V,
                                                     use_q ? q : NULL, use_q ? (size_t)k * V : 0,
                                                     SEED, trial, path, 4, &a2, &t2, NULL),
                       SPECINFER_OK);
      assert_int_equal(a1, a2);
      assert_int_equal(t1, t2);
      for (int i = 0; i < a2; ++i) assert_int_equal(path[i], i);
    }
    specinfer_coupler_destroy(c);
  }
}

/* ---------------------------------------------------------------------------------------------
 * Bad input: an error status with a message, never a crash
 * ------------------------------------------------------------------------------------------- */

static void check_error(specinfer_status rc, specinfer_status want, char *err) {
  if (rc != want)
    fprintf(stderr, "got %s, want %s (%s)\n", specinfer_status_str(rc), specinfer_status_str(want),
            err ? err : "");
  assert_int_equal(rc, want);
  assert_non_null(err);
  assert_true(strlen(err) > 0);
  specinfer_free(err);
}
/* Makes the call first, then reads the message it left in `err` (C leaves the order in which
 * function arguments are evaluated unspecified, so the call cannot be an argument next to err). */
#define expect_error(call, want, err) \
  do {                                \
    err = NULL;                       \
    specinfer_status rc_ = (call);    \
    check_error(rc_, want, err);      \
  } while (0)

static void test_bad_specs(void **state) {
  (void)state;
  const char *bad[] = {
      "lenient:0",   "lenient:1.5", "lenient:-0.5",  "lenient:abc", "lenient:nan",
      "lenient:inf", "lenient:",    "lenient:0.5:2", "typical:0",   "typical:0.1:-1",
      "typical:2",   "gumbel:1",    "rejection:x",   "nonsense",    "",
      "greedy:"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
    specinfer_coupler *c = (specinfer_coupler *)0x1;
    char *err = NULL;
    specinfer_status rc = specinfer_coupler_create(bad[i], &c, &err);
    assert_null(c);
    check_error(rc, SPECINFER_ERR_CONFIG, err);
  }
  char *err = NULL;
  expect_error(specinfer_coupler_create(NULL, NULL, &err), SPECINFER_ERR_INVALID_ARGUMENT, err);
  specinfer_coupler_destroy(NULL);
  assert_string_equal(specinfer_coupler_name(NULL), "");
}

static void test_bad_arrays(void **state) {
  (void)state;
  const char *specs[] = {"greedy", "rejection", "lenient:0.5", "gumbel", "minhash", "typical"};
  for (int si = 0; si < 6; ++si) {
    specinfer_coupler *c = make(specs[si]);
    const int greedy = si == 0;
    float p[2 * V], q[V];
    memcpy(p, pairs[0].p, sizeof(float) * V);
    memcpy(p + V, pairs[0].p, sizeof(float) * V);
    memcpy(q, pairs[0].q, sizeof q);
    int32_t d = 2, acc, tok, path[1], parent = -1;
    char *err = NULL;
#define VERIFY(P, PLEN, Q, QLEN, D) \
  specinfer_coupler_verify(c, V, 1, P, PLEN, Q, QLEN, D, SEED, 0, &acc, &tok, &err)
    /* A good call first. */
    assert_int_equal(VERIFY(p, 2 * V, q, V, &d), SPECINFER_OK);
    assert_null(err);
    /* Size mismatches, NULLs. */
    expect_error(VERIFY(p, 2 * V - 1, q, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(VERIFY(p, 2 * V, q, V + 1, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(VERIFY(p, 2 * V, NULL, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(VERIFY(NULL, 2 * V, q, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(VERIFY(p, 2 * V, q, V, NULL), SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(
        specinfer_coupler_verify(NULL, V, 1, p, 2 * V, q, V, &d, SEED, 0, &acc, &tok, &err),
        SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(specinfer_coupler_verify(c, V, -1, p, 0, q, 0, &d, SEED, 0, &acc, &tok, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(specinfer_coupler_verify(c, 0, 0, p, 0, NULL, 0, NULL, SEED, 0, &acc, &tok, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(specinfer_coupler_verify(c, V, 1, p, 2 * V, q, V, &d, SEED, 0, NULL, &tok, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    /* Tokens out of range. */
    int32_t bad_tok = V;
    expect_error(VERIFY(p, 2 * V, q, V, &bad_tok), SPECINFER_ERR_INVALID_ARGUMENT, err);
    bad_tok = -3;
    expect_error(VERIFY(p, 2 * V, q, V, &bad_tok), SPECINFER_ERR_INVALID_ARGUMENT, err);
    /* NaN anywhere is refused by every coupler. */
    float saved = p[3];
    p[3] = NAN;
    expect_error(VERIFY(p, 2 * V, q, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
    p[3] = saved;
    saved = p[V + 5];
    p[V + 5] = NAN;
    expect_error(VERIFY(p, 2 * V, q, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
    p[V + 5] = saved;
    if (!greedy) {
      /* Inf, negative entries, rows not summing to 1, q(draft) = 0. */
      saved = q[1];
      q[1] = INFINITY;
      expect_error(VERIFY(p, 2 * V, q, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
      q[1] = -0.01f;
      expect_error(VERIFY(p, 2 * V, q, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
      q[1] = saved;
      p[0] += 0.01f;
      expect_error(VERIFY(p, 2 * V, q, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
      p[0] -= 0.01f;
      p[V] *= 0.5f;
      expect_error(VERIFY(p, 2 * V, q, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
      memcpy(p + V, pairs[0].p, sizeof(float) * V);
      float q0[V];
      memcpy(q0, pairs[1].q, sizeof q0); /* q0[2] = 0 */
      expect_error(VERIFY(p, 2 * V, q0, V, &d), SPECINFER_ERR_INVALID_ARGUMENT, err);
      float bad_q[V];
      memcpy(bad_q, q, sizeof bad_q);
      bad_q[0] = 2.0f;
      int32_t t;
      expect_error(specinfer_coupler_draft_sample(c, V, bad_q, V, SEED, 0, &t, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT, err);
    }
    /* Draft sample: sizes, NULLs. */
    int32_t t;
    expect_error(specinfer_coupler_draft_sample(c, V, q, V - 1, SEED, 0, &t, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(specinfer_coupler_draft_sample(c, V, NULL, V, SEED, 0, &t, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(specinfer_coupler_draft_sample(c, V, q, V, SEED, 0, NULL, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    /* Trees: bad parents, small path buffer. */
    parent = 0;
    expect_error(specinfer_coupler_verify_tree(c, V, 1, &d, &parent, p, 2 * V, q, V, SEED, 0, path,
                                               1, &acc, &tok, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    parent = -2;
    expect_error(specinfer_coupler_verify_tree(c, V, 1, &d, &parent, p, 2 * V, q, V, SEED, 0, path,
                                               1, &acc, &tok, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    parent = -1;
    expect_error(specinfer_coupler_verify_tree(c, V, 1, &d, &parent, p, 2 * V, q, V, SEED, 0, path,
                                               0, &acc, &tok, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    expect_error(specinfer_coupler_verify_tree(c, V, 1, &d, &parent, p, 3 * V, q, V, SEED, 0, path,
                                               1, &acc, &tok, &err),
                 SPECINFER_ERR_INVALID_ARGUMENT, err);
    assert_int_equal(specinfer_coupler_verify_tree(c, V, 1, &d, &parent, p, 2 * V, q, V, SEED, 0,
                                                   path, 1, &acc, &tok, &err),
                     SPECINFER_OK);
#undef VERIFY
    specinfer_coupler_destroy(c);
  }
}

/* The sampler through the ABI. */
static void test_sample_probs_abi(void **state) {
  (void)state;
  float logits[V] = {1.0f, 3.0f, 2.0f, -INFINITY, 0.5f, 3.0f, -1.0f, 0.0f}, probs[V];
  specinfer_sampling_params sp;
  specinfer_sampling_params_init(&sp);
  assert_int_equal(sp.struct_size, sizeof sp);
  char *err = NULL;
  assert_int_equal(specinfer_sample_probs(logits, V, &sp, probs, &err), SPECINFER_OK);
  for (int i = 0; i < V; ++i)
    assert_true(probs[i] == (i == 1 ? 1.0f : 0.0f)); /* argmax, lower id on ties */
  sp.temperature = 1.0f;
  assert_int_equal(specinfer_sample_probs(logits, V, &sp, probs, NULL), SPECINFER_OK);
  double z = 0;
  for (int i = 0; i < V; ++i) z += exp((double)logits[i]);
  for (int i = 0; i < V; ++i) assert_true(fabs(probs[i] - exp((double)logits[i]) / z) < 1e-6);
  sp.top_k = 2;
  assert_int_equal(specinfer_sample_probs(logits, V, &sp, probs, NULL), SPECINFER_OK);
  assert_true(fabs(probs[1] - 0.5) < 1e-6 && fabs(probs[5] - 0.5) < 1e-6);
  sp.top_k = 0;
  sp.temperature = -1.0f;
  expect_error(specinfer_sample_probs(logits, V, &sp, probs, &err), SPECINFER_ERR_INVALID_ARGUMENT,
               err);
  sp.temperature = 1.0f;
  sp.top_p = 0.0f;
  expect_error(specinfer_sample_probs(logits, V, &sp, probs, &err), SPECINFER_ERR_INVALID_ARGUMENT,
               err);
  sp.top_p = 1.0f;
  sp.min_p = 1.5f;
  expect_error(specinfer_sample_probs(logits, V, &sp, probs, &err), SPECINFER_ERR_INVALID_ARGUMENT,
               err);
  sp.min_p = 0.0f;
  logits[0] = NAN;
  expect_error(specinfer_sample_probs(logits, V, &sp, probs, &err), SPECINFER_ERR_INVALID_ARGUMENT,
               err);
  expect_error(specinfer_sample_probs(logits, V, &sp, logits, &err), SPECINFER_ERR_INVALID_ARGUMENT,
               err);
  expect_error(specinfer_sample_probs(NULL, V, &sp, probs, &err), SPECINFER_ERR_INVALID_ARGUMENT,
               err);
  sp.struct_size = 0;
  logits[0] = 1.0f;
  expect_error(specinfer_sample_probs(logits, V, &sp, probs, &err), SPECINFER_ERR_INVALID_ARGUMENT,
               err);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_rejection_marginal_and_acceptance, setup),
      cmocka_unit_test_setup(test_rejection_point_mass_drafts, setup),
      cmocka_unit_test_setup(test_chain_sequences_exact, setup),
      cmocka_unit_test_setup(test_race_drafter_invariance, setup),
      cmocka_unit_test_setup(test_race_marginals_and_match, setup),
      cmocka_unit_test_setup(test_lenient_acceptance, setup),
      cmocka_unit_test_setup(test_typical_rule, setup),
      cmocka_unit_test_setup(test_greedy, setup),
      cmocka_unit_test_setup(test_tokens_per_round_iid, setup),
      cmocka_unit_test_setup(test_tree_mss_marginal, setup),
      cmocka_unit_test_setup(test_tree_sequences_exact, setup),
      cmocka_unit_test_setup(test_tree_chain_equals_verify, setup),
      cmocka_unit_test_setup(test_bad_specs, setup),
      cmocka_unit_test_setup(test_bad_arrays, setup),
      cmocka_unit_test_setup(test_sample_probs_abi, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
