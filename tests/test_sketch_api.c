/* Black-box tests of the sketcher C ABI: buffers and size queries, error statuses and messages,
 * rows + estimate_many, header reading. The statistics are in test_sketch.cpp. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "specinfer.h"

#include "support/cmocka_setup.h"

#define DIM 64
#define M 16

static void fill(float *x, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((double)(s >> 8) / (double)(1u << 24) - 0.5);
  }
}

static specinfer_sketcher *make(const char *kind, const char *options) {
  specinfer_sketcher *s = NULL;
  char *err = NULL;
  specinfer_status rc = specinfer_sketcher_create(kind, DIM, M, 7, options, &s, &err);
  assert_int_equal(rc, SPECINFER_OK);
  assert_null(err);
  assert_non_null(s);
  return s;
}

static void test_create_errors(void **state) {
  (void)state;
  specinfer_sketcher *s = (specinfer_sketcher *)1;
  char *err = NULL;
  assert_int_equal(specinfer_sketcher_create("jl", DIM, 0, 1, NULL, &s, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_null(s);
  assert_non_null(err);
  assert_non_null(strstr(err, "size"));
  specinfer_free(err);
  assert_int_equal(specinfer_sketcher_create("jl", -3, 4, 1, NULL, &s, NULL),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_sketcher_create("bloom", DIM, 4, 1, NULL, &s, &err),
                   SPECINFER_ERR_CONFIG);
  specinfer_free(err);
  assert_int_equal(specinfer_sketcher_create("jl", DIM, 4, 1, "color=red", &s, &err),
                   SPECINFER_ERR_CONFIG);
  assert_non_null(strstr(err, "color"));
  specinfer_free(err);
  assert_int_equal(specinfer_sketcher_create(NULL, DIM, 4, 1, NULL, &s, NULL),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_sketcher_create("jl", DIM, 4, 1, NULL, NULL, NULL),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  specinfer_sketcher_destroy(NULL);
}

static void test_round_trip(void **state) {
  (void)state;
  const char *kinds[] = {"jl", "countsketch", "qjl", "threshold", "priority"};
  float a[DIM], b[DIM];
  fill(a, DIM, 1);
  fill(b, DIM, 2);
  for (size_t k = 0; k < 5; ++k) {
    specinfer_sketcher *s = make(kinds[k], NULL);
    specinfer_sketcher_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    assert_int_equal(specinfer_sketcher_get_info(s, &info), SPECINFER_OK);
    assert_string_equal(info.kind, kinds[k]);
    assert_int_equal(info.dim, DIM);
    assert_int_equal(info.size, M);
    const int is_qjl = strcmp(kinds[k], "qjl") == 0;
    const int32_t qflag = is_qjl ? SPECINFER_SKETCH_QUERY : 0;

    /* Size query: cap 0 -> BUFFER_TOO_SMALL and the exact length. */
    size_t need = 0, got = 0, bound = 0;
    int32_t exact = -1;
    char *err = NULL;
    assert_int_equal(specinfer_sketcher_sketch(s, a, DIM, 0, NULL, 0, &need, &err),
                     SPECINFER_ERR_BUFFER_TOO_SMALL);
    specinfer_free(err);
    assert_int_equal(specinfer_sketcher_sketch_bytes(s, 0, &bound, &exact), SPECINFER_OK);
    assert_true(need <= bound);
    assert_int_equal(exact, info.fixed_size);
    if (exact) assert_int_equal(need, bound);
    unsigned char *sa = malloc(need);
    assert_int_equal(specinfer_sketcher_sketch(s, a, DIM, 0, sa, need - 1, &got, NULL),
                     SPECINFER_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(specinfer_sketcher_sketch(s, a, DIM, 0, sa, need, &got, NULL), SPECINFER_OK);
    assert_int_equal(got, need);

    unsigned char sb[4096];
    size_t nb = 0;
    assert_int_equal(specinfer_sketcher_sketch(s, b, DIM, qflag, sb, sizeof sb, &nb, NULL),
                     SPECINFER_OK);
    double est = NAN;
    assert_int_equal(specinfer_sketcher_estimate(s, sa, need, sb, nb, &est, NULL), SPECINFER_OK);
    assert_true(isfinite(est));

    /* Header. */
    specinfer_sketch_header h;
    memset(&h, 0, sizeof h);
    h.struct_size = sizeof h;
    assert_int_equal(specinfer_sketch_read_header(sa, need, &h, NULL), SPECINFER_OK);
    assert_string_equal(h.kind, kinds[k]);
    assert_int_equal(h.dim, DIM);
    assert_int_equal(h.size, M);
    assert_int_equal(h.n_bytes, need);
    assert_int_equal(specinfer_sketch_read_header(sa, need - 1, &h, NULL), SPECINFER_ERR_FORMAT);

    /* Bad input. */
    assert_int_equal(specinfer_sketcher_sketch(s, a, DIM - 1, 0, sb, sizeof sb, &got, &err),
                     SPECINFER_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "dimension"));
    specinfer_free(err);
    float bad[DIM];
    memcpy(bad, a, sizeof bad);
    bad[9] = NAN;
    assert_int_equal(specinfer_sketcher_sketch(s, bad, DIM, 0, sb, sizeof sb, &got, NULL),
                     SPECINFER_ERR_INVALID_ARGUMENT);
    assert_int_equal(specinfer_sketcher_sketch(s, a, DIM, 8, sb, sizeof sb, &got, NULL),
                     SPECINFER_ERR_INVALID_ARGUMENT);
    assert_int_equal(specinfer_sketcher_estimate(s, sa, need - 3, sa, need, &est, &err),
                     SPECINFER_ERR_FORMAT);
    assert_non_null(err);
    specinfer_free(err);
    assert_int_equal(specinfer_sketcher_estimate(s, "garbage, not a sketch at all......", 34, sa,
                                                 need, &est, NULL),
                     SPECINFER_ERR_FORMAT);
    assert_int_equal(specinfer_sketcher_estimate(NULL, sa, need, sa, need, &est, NULL),
                     SPECINFER_ERR_INVALID_ARGUMENT);

    /* Rows + estimate_many == one estimate per key. */
    enum { ROWS = 9 };
    specinfer_status rc0;
    float rows[ROWS * (DIM + 3)];
    fill(rows, ROWS * (DIM + 3), 3);
    size_t total = 0, offsets[ROWS + 1];
    assert_int_equal(
        specinfer_sketcher_sketch_rows(s, rows, ROWS, DIM + 3, 0, NULL, 0, NULL, &total, NULL),
        SPECINFER_ERR_BUFFER_TOO_SMALL);
    unsigned char *keys = malloc(total);
    assert_int_equal(specinfer_sketcher_sketch_rows(s, rows, ROWS, DIM + 3, 0, keys, total, offsets,
                                                    &total, NULL),
                     SPECINFER_OK);
    assert_int_equal(offsets[0], 0);
    assert_int_equal(offsets[ROWS], total);
    double scores[ROWS];
    rc0 = specinfer_sketcher_estimate_many(s, sb, nb, keys, offsets, ROWS, scores, &err);
    if (rc0) print_message("%s: %s\n", kinds[k], err);
    assert_int_equal(rc0, SPECINFER_OK);
    for (size_t i = 0; i < ROWS; ++i) {
      double one;
      assert_int_equal(specinfer_sketcher_estimate(s, sb, nb, keys + offsets[i],
                                                   offsets[i + 1] - offsets[i], &one, NULL),
                       SPECINFER_OK);
      assert_true(one == scores[i]);
      /* Row i sketched alone gives the same bytes. */
      unsigned char single[4096];
      size_t n1 = 0;
      assert_int_equal(specinfer_sketcher_sketch(s, rows + i * (DIM + 3), DIM, 0, single,
                                                 sizeof single, &n1, NULL),
                       SPECINFER_OK);
      assert_int_equal(n1, offsets[i + 1] - offsets[i]);
      assert_memory_equal(single, keys + offsets[i], n1);
    }
    /* A corrupted key is named. */
    keys[offsets[4]] ^= 0xff;
    assert_int_equal(specinfer_sketcher_estimate_many(s, sb, nb, keys, offsets, ROWS, scores, &err),
                     SPECINFER_ERR_FORMAT);
    assert_non_null(strstr(err, "key 4"));
    specinfer_free(err);
    assert_int_equal(specinfer_sketcher_sketch_rows(s, rows, ROWS, DIM - 1, 0, keys, total, offsets,
                                                    &total, NULL),
                     SPECINFER_ERR_INVALID_ARGUMENT);

    /* Distances: linear kinds only. */
    double d2 = -1;
    specinfer_status rc = specinfer_sketcher_distance2(s, sa, need, sa, need, &d2, NULL);
    if (info.linear && !is_qjl) {
      assert_int_equal(rc, SPECINFER_OK);
      assert_true(d2 == 0.0);
    } else {
      assert_int_equal(rc, SPECINFER_ERR_UNSUPPORTED);
    }
    free(keys);
    free(sa);
    specinfer_sketcher_destroy(s);
  }
}

/* Two sketchers created with the same arguments make interchangeable sketches; another seed does
 * not. */
static void test_interchangeable(void **state) {
  (void)state;
  float a[DIM];
  fill(a, DIM, 4);
  specinfer_sketcher *s1 = make("threshold", NULL), *s2 = make("threshold", NULL), *s3 = NULL;
  assert_int_equal(specinfer_sketcher_create("threshold", DIM, M, 8, NULL, &s3, NULL),
                   SPECINFER_OK);
  unsigned char x1[2048], x2[2048], x3[2048];
  size_t n1, n2, n3;
  assert_int_equal(specinfer_sketcher_sketch(s1, a, DIM, 0, x1, sizeof x1, &n1, NULL),
                   SPECINFER_OK);
  assert_int_equal(specinfer_sketcher_sketch(s2, a, DIM, 0, x2, sizeof x2, &n2, NULL),
                   SPECINFER_OK);
  assert_int_equal(specinfer_sketcher_sketch(s3, a, DIM, 0, x3, sizeof x3, &n3, NULL),
                   SPECINFER_OK);
  assert_int_equal(n1, n2);
  assert_memory_equal(x1, x2, n1);
  double e;
  assert_int_equal(specinfer_sketcher_estimate(s2, x1, n1, x2, n2, &e, NULL), SPECINFER_OK);
  char *err = NULL;
  assert_int_equal(specinfer_sketcher_estimate(s1, x1, n1, x3, n3, &e, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err, "seed"));
  specinfer_free(err);
  specinfer_sketcher_destroy(s1);
  specinfer_sketcher_destroy(s2);
  specinfer_sketcher_destroy(s3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_errors),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_interchangeable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
