// White-box tests of lib/sampling and of the coupled choices in lib/coupling: Philox known
// answers, the counter-based RNG's invariance to order and threads, logits -> probabilities
// against straightforward references, and the pruned Gumbel / MinHash scans against brute force.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

#include "coupling/step_coupler.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "util/error.h"
#include "util/isa.h"

#include <stdint.h>

#include "support/cmocka_setup.h"

using specinfer::CounterRng;
using specinfer::RngStream;
using specinfer::SamplingParams;

namespace {

std::vector<float> random_logits(int n, uint64_t seed, float scale);

// Random123's published known-answer vectors for Philox4x32-10.
void test_philox_known_answers(void **) {
  using A4 = std::array<uint32_t, 4>;
  using A2 = std::array<uint32_t, 2>;
  assert_true((specinfer::philox4x32_10(A4{0, 0, 0, 0}, A2{0, 0}) ==
               A4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  assert_true((specinfer::philox4x32_10(A4{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                        A2{0xffffffffu, 0xffffffffu}) ==
               A4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  assert_true((specinfer::philox4x32_10(A4{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                        A2{0xa4093822u, 0x299f31d0u}) ==
               A4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

void test_rng_bulk_matches_single(void **) {
  CounterRng rng(42, 1234567, RngStream::kGumbel);
  for (uint64_t first : {0ull, 1ull, 7ull, 1000ull}) {
    for (size_t n : {0u, 1u, 2u, 5u, 64u}) {
      std::vector<double> bulk(n);
      rng.uniforms(first, n, bulk.data());
      for (size_t j = 0; j < n; ++j) assert_true(bulk[j] == rng.uniform(first + j));
    }
  }
}

// The vectorized generator gives the scalar one's values, and so do the scans that use it.
void test_rng_isa_invariance(void **) {
  CounterRng rng(0x1234, 99, RngStream::kGumbel);
  std::vector<double> vec(1001), sca(1001);
  std::vector<uint32_t> bv(4 * 77), bs(4 * 77);
  auto w = random_logits(5000, 3, 1.0f);
  std::vector<float> p(w.size());
  SamplingParams sp;
  sp.temperature = 1;
  specinfer::logits_to_probs(w.data(), 5000, sp, p.data());
  rng.uniforms(3, vec.size(), vec.data());
  rng.blocks(11, 77, bv.data());
  int g_vec = specinfer::gumbel_choice(p.data(), 5000, 8, 8),
      m_vec = specinfer::minhash_choice(p.data(), 5000, 8, 8);
  specinfer::Isa prev = specinfer::set_active_isa(specinfer::Isa::scalar);
  rng.uniforms(3, sca.size(), sca.data());
  rng.blocks(11, 77, bs.data());
  int g_sca = specinfer::gumbel_choice(p.data(), 5000, 8, 8),
      m_sca = specinfer::minhash_choice(p.data(), 5000, 8, 8);
  specinfer::set_active_isa(prev);
  std::printf("  active isa %s\n", specinfer::isa_name(prev));
  assert_true(vec == sca);
  assert_true(bv == bs);
  for (size_t j = 0; j < 77; ++j) {
    auto b = rng.block(static_cast<uint32_t>(11 + j));
    for (size_t k = 0; k < 4; ++k) assert_true(bs[4 * j + k] == b[k]);
  }
  assert_int_equal(g_vec, g_sca);
  assert_int_equal(m_vec, m_sca);
}

// Values depend on (seed, position, stream, index) only; each of them changes the value.
void test_rng_keys(void **) {
  const double base = CounterRng(1, 10, RngStream::kSample).uniform(0);
  assert_true(base == CounterRng(1, 10, RngStream::kSample).uniform(0));
  assert_true(base != CounterRng(2, 10, RngStream::kSample).uniform(0));
  assert_true(base != CounterRng(1, 11, RngStream::kSample).uniform(0));
  assert_true(base != CounterRng(1, 10, RngStream::kAccept).uniform(0));
  assert_true(base != CounterRng(1, 10, RngStream::kSample).uniform(1));
  // 64-bit seeds and positions use all their bits.
  assert_true(CounterRng(1ull << 40, 10, 4).uniform(0) != CounterRng(0, 10, 4).uniform(0));
  assert_true(CounterRng(1, int64_t(1) << 40, 4).uniform(0) != CounterRng(1, 0, 4).uniform(0));
}

// Uniformity: 20 equal bins over 2 * 10^5 values (positions 0.., index 0 and 1): chi-square
// below the 1e-6 critical value for 19 degrees of freedom (~63.4); mean within 4 sigma of 1/2.
void test_rng_uniformity(void **) {
  const int bins = 20;
  const long n = 100000;
  std::vector<long> counts(bins, 0);
  double sum = 0;
  for (long pos = 0; pos < n; ++pos) {
    CounterRng rng(0xabcdef, pos, RngStream::kSample);
    for (int i = 0; i < 2; ++i) {
      double u = rng.uniform(static_cast<uint64_t>(i));
      assert_true(u > 0 && u < 1);
      counts[static_cast<size_t>(u * bins)]++;
      sum += u;
    }
  }
  double e = 2.0 * n / bins, stat = 0;
  for (long c : counts) stat += (c - e) * (c - e) / e;
  std::printf("  rng uniformity chi2 = %.2f (critical 63.4)\n", stat);
  assert_true(stat < 63.4);
  double mean = sum / (2.0 * n), sigma = std::sqrt(1.0 / 12.0 / (2.0 * n));
  assert_true(std::fabs(mean - 0.5) < 4 * sigma);
}

// The same values whatever the thread count and the order of the requests.
void test_rng_thread_invariance(void **) {
  const int n = 4096;
  std::vector<double> serial(n), parallel(n);
  for (int i = 0; i < n; ++i) serial[i] = CounterRng(77, i / 16, RngStream::kDraft).uniform(i % 16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = n - 1 - t; i >= 0; i -= 4)
        parallel[i] = CounterRng(77, i / 16, RngStream::kDraft).uniform(i % 16);
    });
  for (auto &th : threads) th.join();
  assert_true(serial == parallel);
}

std::vector<float> random_logits(int n, uint64_t seed, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  CounterRng rng(seed, 0, 99);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(scale * (rng.uniform(i) * 2 - 1));
  return v;
}

std::vector<double> softmax_ref(const std::vector<float> &l, double t) {
  double m = *std::max_element(l.begin(), l.end()), z = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - m) / t);
  for (double &x : p) x /= z;
  return p;
}

bool throws_invalid(const float *logits, int32_t vocab, const SamplingParams &sp) {
  std::vector<float> out(static_cast<size_t>(std::max(vocab, 1)));
  try {
    specinfer::logits_to_probs(logits, vocab, sp, out.data());
  } catch (const specinfer::Error &e) {
    return e.code() == SPECINFER_ERR_INVALID_ARGUMENT && std::string(e.what()).size() > 0;
  }
  return false;
}

void test_temperature(void **) {
  auto l = random_logits(1000, 1, 8.0f);
  std::vector<float> p(l.size());
  for (float t : {0.3f, 1.0f, 2.5f}) {
    SamplingParams sp;
    sp.temperature = t;
    specinfer::logits_to_probs(l.data(), 1000, sp, p.data());
    auto ref = softmax_ref(l, t);
    double sum = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      assert_true(std::fabs(p[i] - ref[i]) <= 1e-6 * std::max(1.0, ref[i] * 1e3));
      sum += p[i];
    }
    assert_true(std::fabs(sum - 1) < 1e-5);
  }
  // Temperature 0: a point mass on the first maximum.
  std::vector<float> ties = {0.0f, 2.0f, -1.0f, 2.0f};
  std::vector<float> q(4);
  specinfer::logits_to_probs(ties.data(), 4, SamplingParams{}, q.data());
  assert_true(q == (std::vector<float>{0, 1, 0, 0}));
  assert_int_equal(specinfer::argmax(ties.data(), 4), 1);
  // -inf logits get probability 0.
  std::vector<float> masked = {1.0f, -std::numeric_limits<float>::infinity(), 1.0f};
  SamplingParams sp;
  sp.temperature = 1;
  specinfer::logits_to_probs(masked.data(), 3, sp, q.data());
  assert_true(q[1] == 0 && std::fabs(q[0] - 0.5f) < 1e-7 && std::fabs(q[2] - 0.5f) < 1e-7);
}

// Reference filters: sort everything (probability descending, id ascending).
std::vector<double> filtered_ref(const std::vector<float> &l, const SamplingParams &sp) {
  auto p = softmax_ref(l, sp.temperature);
  std::vector<int> idx(p.size());
  std::iota(idx.begin(), idx.end(), 0);
  // The library compares the float probabilities; so does the reference.
  std::vector<float> pf(p.size());
  double zf = 0;
  {
    double m = *std::max_element(l.begin(), l.end());
    for (size_t i = 0; i < l.size(); ++i)
      zf += pf[i] = static_cast<float>(std::exp((l[i] - m) / sp.temperature));
  }
  // top-k by logits (ties to the lower id), then the rest by probability.
  if (sp.top_k > 0 && static_cast<size_t>(sp.top_k) < idx.size()) {
    std::sort(idx.begin(), idx.end(),
              [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    idx.resize(static_cast<size_t>(sp.top_k));
  }
  std::sort(idx.begin(), idx.end(),
            [&](int a, int b) { return pf[a] > pf[b] || (pf[a] == pf[b] && a < b); });
  size_t n = idx.size();
  if (sp.top_p < 1) {
    double total = 0, acc = 0;
    for (size_t j = 0; j < n; ++j) total += pf[idx[j]];
    for (size_t j = 0; j < n; ++j) {
      acc += pf[idx[j]];
      if (acc >= sp.top_p * total) {
        n = j + 1;
        break;
      }
    }
  }
  std::vector<double> out(p.size(), 0.0);
  float pmax = pf[idx[0]];
  double z = 0;
  for (size_t j = 0; j < n; ++j)
    if (sp.min_p == 0 || pf[idx[j]] >= sp.min_p * pmax) z += out[idx[j]] = pf[idx[j]];
  for (double &x : out) x /= z;
  return out;
}

void test_filters_against_reference(void **) {
  for (int vocab : {50, 3000, 152064}) {
    auto l = random_logits(vocab, static_cast<uint64_t>(vocab), 10.0f);
    std::vector<float> p(l.size());
    SamplingParams cases[6];
    cases[0].temperature = 1.0f, cases[0].top_k = 10;
    cases[1].temperature = 0.7f, cases[1].top_p = 0.9f;
    cases[2].temperature = 1.3f, cases[2].min_p = 0.05f;
    cases[3].temperature = 1.0f, cases[3].top_k = 40, cases[3].top_p = 0.5f, cases[3].min_p = 0.1f;
    cases[4].temperature = 2.0f, cases[4].top_p = 0.999f;
    cases[5].temperature = 1.0f, cases[5].top_k = 1;
    for (const SamplingParams &sp : cases) {
      specinfer::logits_to_probs(l.data(), vocab, sp, p.data());
      auto ref = filtered_ref(l, sp);
      size_t kept = 0, kept_ref = 0;
      for (size_t i = 0; i < p.size(); ++i) {
        kept += p[i] > 0;
        kept_ref += ref[i] > 0;
        assert_true((p[i] > 0) == (ref[i] > 0));
        assert_true(std::fabs(p[i] - ref[i]) <= 1e-5 * std::max(ref[i], 1e-3));
      }
      if (sp.top_k > 0) assert_true(kept <= static_cast<size_t>(sp.top_k));
      std::printf("  vocab %6d T=%.1f k=%d p=%.3f min_p=%.2f: kept %zu (reference %zu)\n", vocab,
                  static_cast<double>(sp.temperature), sp.top_k, static_cast<double>(sp.top_p),
                  static_cast<double>(sp.min_p), kept, kept_ref);
    }
  }
  // Ties at the top-k cut go to the lower id.
  std::vector<float> flat(10, 0.0f), p(10);
  SamplingParams sp;
  sp.temperature = 1;
  sp.top_k = 3;
  specinfer::logits_to_probs(flat.data(), 10, sp, p.data());
  for (int i = 0; i < 10; ++i) assert_true(std::fabs(p[i] - (i < 3 ? 1.0f / 3 : 0.0f)) < 1e-6);
}

void test_sampler_bad_input(void **) {
  std::vector<float> l = {0.1f, 0.2f, 0.3f};
  SamplingParams sp;
  sp.temperature = 1;
  assert_false(throws_invalid(l.data(), 3, sp));
  SamplingParams bad = sp;
  bad.temperature = -0.5f;
  assert_true(throws_invalid(l.data(), 3, bad));
  bad = sp;
  bad.temperature = std::numeric_limits<float>::quiet_NaN();
  assert_true(throws_invalid(l.data(), 3, bad));
  bad = sp;
  bad.top_k = -1;
  assert_true(throws_invalid(l.data(), 3, bad));
  bad = sp;
  bad.top_p = 0;
  assert_true(throws_invalid(l.data(), 3, bad));
  bad = sp;
  bad.top_p = 1.01f;
  assert_true(throws_invalid(l.data(), 3, bad));
  bad = sp;
  bad.min_p = -0.1f;
  assert_true(throws_invalid(l.data(), 3, bad));
  assert_true(throws_invalid(l.data(), 0, sp));
  l[1] = std::numeric_limits<float>::quiet_NaN();
  assert_true(throws_invalid(l.data(), 3, sp));
  l[1] = std::numeric_limits<float>::infinity();
  assert_true(throws_invalid(l.data(), 3, sp));
  std::vector<float> all_masked(3, -std::numeric_limits<float>::infinity());
  assert_true(throws_invalid(all_masked.data(), 3, sp));
}

void test_sample_index(void **) {
  std::vector<float> p = {0.0f, 0.25f, 0.0f, 0.75f, 0.0f};
  assert_int_equal(specinfer::sample_index(p.data(), 5, 1e-12), 1);
  assert_int_equal(specinfer::sample_index(p.data(), 5, 0.2499), 1);
  assert_int_equal(specinfer::sample_index(p.data(), 5, 0.2501), 3);
  assert_int_equal(specinfer::sample_index(p.data(), 5, 1 - 1e-16), 3);  // never the zero tail
  std::vector<float> z(3, 0.0f);
  assert_int_equal(specinfer::sample_index(z.data(), 3, 0.5), -1);
}

// The scans skip tokens with a bound; they must pick exactly what a full scan picks.
int gumbel_brute(const std::vector<float> &w, uint64_t seed, int64_t pos) {
  CounterRng rng(seed, pos, RngStream::kGumbel);
  int best = -1;
  double bv = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0) continue;
    double s = -std::log(rng.uniform(i)) / w[i];
    if (best < 0 || s < bv) bv = s, best = static_cast<int>(i);
  }
  return best;
}

// MinHash darts generated in full, chunk (unit of time) by chunk: in each chunk every token's
// darts (the lowest, then all the others until the chunk ends) without pruning; the first chunk
// where some token has a dart under its weight decides.
int minhash_brute(const std::vector<float> &w, uint64_t seed, int64_t pos) {
  auto stream = [](uint32_t c, uint32_t j) {
    return static_cast<uint32_t>(RngStream::kMinHash) + c * 256 + j;
  };
  for (uint32_t c = 0;; ++c) {
    int best = -1;
    double bv = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] <= 0) continue;
      double m = -std::log(CounterRng(seed, pos, stream(c, 0)).uniform(i));
      if (m >= 1) continue;  // no dart in this chunk
      double first = m < w[i] ? CounterRng(seed, pos, stream(c, 255)).uniform(i) : 2.0;
      double t = 0;
      for (uint32_t j = 1; j < 255; ++j) {
        auto b = CounterRng(seed, pos, stream(c, j)).block(static_cast<uint32_t>(i));
        t += -std::log(CounterRng::to_open_unit(b[0] | (uint64_t(b[1]) << 32))) / (1 - m);
        if (t >= 1) break;
        double h = m + CounterRng::to_open_unit(b[2] | (uint64_t(b[3]) << 32)) * (1 - m);
        if (h < w[i]) first = std::min(first, t);
      }
      if (first < 1 && (best < 0 || first < bv)) bv = first, best = static_cast<int>(i);
    }
    if (best >= 0) return best;
  }
}

void test_race_scans_match_brute_force(void **) {
  for (int trial = 0; trial < 300; ++trial) {
    const int vocab = 50 + trial * 7 % 400;
    auto l = random_logits(vocab, 1000 + trial, trial % 3 == 0 ? 1.0f : 12.0f);
    std::vector<float> w(static_cast<size_t>(vocab));
    SamplingParams sp;
    sp.temperature = 1;
    sp.top_k = trial % 4 == 0 ? 20 : 0;
    specinfer::logits_to_probs(l.data(), vocab, sp, w.data());
    assert_int_equal(specinfer::gumbel_choice(w.data(), vocab, 5, trial),
                     gumbel_brute(w, 5, trial));
    assert_int_equal(specinfer::minhash_choice(w.data(), vocab, 5, trial),
                     minhash_brute(w, 5, trial));
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_philox_known_answers),
      cmocka_unit_test(test_rng_bulk_matches_single),
      cmocka_unit_test(test_rng_isa_invariance),
      cmocka_unit_test(test_rng_keys),
      cmocka_unit_test(test_rng_uniformity),
      cmocka_unit_test(test_rng_thread_invariance),
      cmocka_unit_test(test_temperature),
      cmocka_unit_test(test_filters_against_reference),
      cmocka_unit_test(test_sampler_bad_input),
      cmocka_unit_test(test_sample_index),
      cmocka_unit_test(test_race_scans_match_brute_force),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
