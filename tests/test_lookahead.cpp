// The adaptive draft length (lib/session/lookahead.h) on synthetic round histories: it drafts long
// when drafts are accepted and target passes cost the same at any size, stops when they are
// rejected, pauses briefly for free drafters and longer for costly ones, and uses the burst state
// (a draft accepted whole) to draft longer than the average rate alone would; a costly drafter that
// ends its own drafts is asked for the most while it pays (capped by the rates where each token
// makes a verify pass clearly dearer) and paused when it does not.
#include "session/lookahead.h"

#include <algorithm>

#include "support/cmocka_setup.h"
#include "support/uniform.h"

using specinfer::Lookahead;

namespace {

// One round: ask for k, draft it, accept `accept(k)` tokens; passes cost base * (1 + slope * k).
template <class F>
int32_t round(Lookahead &la, F accept, double draft_ms_per_token, double base, double slope) {
  const int32_t k = la.next();
  const int32_t a = k > 0 ? accept(k) : 0;
  la.observe(k, k, a, k * draft_ms_per_token, base * (1.0 + slope * k), k + 1);
  return k;
}

void test_all_accepted_memory_bound(void **) {
  Lookahead la;
  la.configure(8, true);
  int32_t k = 0;
  for (int i = 0; i < 30; ++i)
    k = round(
        la, [](int32_t n) { return n; }, 0.0, 40.0, 0.0);
  assert_int_equal(k, 8);  // every token accepted, passes free: draft the most allowed
}

void test_rejections_pause(void **) {
  // Free drafts, all rejected: drafting stops, with short pauses (probes every few rounds).
  Lookahead la;
  la.configure(8, true);
  int drafted_rounds = 0;
  for (int i = 0; i < 60; ++i)
    if (round(
            la, [](int32_t) { return 0; }, 0.0, 40.0, 0.2) > 0)
      ++drafted_rounds;
  assert_true(drafted_rounds >= 6 && drafted_rounds <= 20);
  // Costly drafts (c = 0.5), all rejected: long pauses.
  Lookahead lb;
  lb.configure(8, true);
  int costly_rounds = 0;
  for (int i = 0; i < 60; ++i)
    if (round(
            lb, [](int32_t) { return 0; }, 20.0, 40.0, 0.2) > 0)
      ++costly_rounds;
  assert_true(costly_rounds >= 1 && costly_rounds <= 5);
  assert_true(costly_rounds < drafted_rounds);
}

void test_bursts(void **) {
  // Rounds follow a Markov chain: a copy round (whole draft accepted) is followed by another copy
  // with probability 0.9, a miss (first token rejected) by a copy with probability 0.2 (fixed
  // pseudo-random sequence). The hot state (after a copy) should ask for longer drafts than the
  // cold one.
  Lookahead la;
  la.configure(8, true);
  bool copying = true;
  Uniform uniform{12345};
  double sum_hot = 0, sum_cold = 0;
  int n_hot = 0, n_cold = 0;
  for (int i = 0; i < 400; ++i) {
    const bool hot_now = copying;
    const int32_t k = round(
        la, [&](int32_t n) { return copying ? n : 0; }, 0.0, 40.0, 0.25);
    if (k > 0) {
      if (i > 50) {
        if (hot_now)
          sum_hot += k, ++n_hot;
        else
          sum_cold += k, ++n_cold;
      }
      const double u = uniform();
      copying = u < (copying ? 0.9 : 0.2);
    }
  }
  assert_true(n_hot > 10 && n_cold > 3);
  print_message("mean k: hot %.2f (%d rounds), cold %.2f (%d rounds)\n", sum_hot / n_hot, n_hot,
                sum_cold / n_cold, n_cold);
  assert_true(sum_hot / n_hot > sum_cold / n_cold + 1.0);
}

// A costly drafter that ends its own drafts on evidence the rates do not have: rounds alternate
// between a confident one (it drafts 4, all accepted) and an unsure one (it drafts 1, rejected,
// and declines the rest). By the rates, a draft after a whole accepted one always fails, so they
// would pause there; the drafter's own stop makes every round pay (6 tokens per 4.5 passes), so
// the lookahead drafts in every round but the plain ones that re-measure the pass time, and asks
// for the most wherever the rates do not cap it: in every round when passes cost nearly the same
// at any size, and in the confident rounds when each token adds 30% to a pass (there the unsure
// rounds are asked for the one token they draft anyway). When nothing is accepted, drafting
// pauses for most rounds.
void test_self_limiting_drafter(void **) {
  for (const double slope : {0.02, 0.3})
    for (const bool pays : {true, false}) {
      Lookahead la;
      la.configure(8, true);
      int asked_max = 0, asked_one = 0, drafting = 0, tokens = 0;
      bool confident = true;
      for (int i = 0; i < 60; ++i) {
        const int32_t k = la.next();
        const bool sure = confident;
        int32_t d = 0, a = 0;
        if (k > 0) {
          d = std::min<int32_t>(k, confident ? 4 : 1);
          a = pays && confident ? d : 0;
          confident = !confident;
        }
        // One draft step costs a quarter of a single-token pass.
        la.observe(k, d, a, (d + (d < k ? 1 : 0)) * 10.0, 40.0 * (1.0 + slope * d), d + 1);
        if (i >= 10) {
          if (k == 8 && (sure || slope < 0.1)) ++asked_max;
          if (k == 1 && !sure) ++asked_one;
          if (k > 0) ++drafting;
          tokens += a + 1;
        }
      }
      print_message("slope %.2f, %s: asked for 8 in %d of 50 rounds, drafted in %d, %d tokens\n",
                    slope, pays ? "pays" : "rejected", asked_max, drafting, tokens);
      if (pays) {
        assert_true(la.self_stop_rate() > 0.3);
        assert_true(drafting >= 48);
        assert_true(asked_max >= (slope < 0.1 ? 45 : 22));
        if (slope > 0.1) assert_true(asked_one >= 22);
        assert_true(tokens >= 140);
      } else {
        assert_true(drafting <= 12);
      }
    }
}

// A draft model at a long context: it drafts up to 4 tokens of which each is accepted with
// probability 0.45, one draft step costs 0.3 of a one-token pass, and every token adds 0.3 of a
// pass to the verify pass (attention once per token over a long cache). Asking for the most
// would run at about 0.6 of plain decoding's speed; the rates cap its drafts at one or two tokens,
// which pay about as well as plain decoding, and it stays within 10% of plain decoding's speed.
void test_steep_passes_cap_self_limiting_drafts(void **) {
  Lookahead la;
  la.configure(8, true);
  Uniform uniform{4242};
  double tokens = 0, ms = 0;
  int capped = 0, drafting = 0;
  for (int i = 0; i < 300; ++i) {
    const int32_t k = la.next();
    // It declines a token it is unsure of: a quarter of the time at each position.
    int32_t d = 0;
    while (d < std::min<int32_t>(k, 4) && uniform() < 0.75) ++d;
    int32_t a = 0;
    while (a < d && uniform() < 0.45) ++a;
    const double draft = (d + (d < k ? 1 : 0)) * 12.0, pass = 40.0 * (1.0 + 0.3 * d);
    la.observe(k, d, a, draft, pass, d + 1);
    if (i >= 50) {
      tokens += a + 1;
      ms += draft + pass;
      if (k > 0) ++drafting;
      if (k > 0 && k <= 2) ++capped;
    }
  }
  const double speed = tokens * 40.0 / ms;  // against plain decoding's one token per 40 ms
  print_message("%d drafting rounds of 250, %d asked for 1 or 2; %.3f of plain speed\n", drafting,
                capped, speed);
  assert_true(capped >= drafting * 9 / 10);
  assert_true(speed > 0.9);
}

// A draft model that drafts at most 4 tokens while the session allows 8, accepted at a rate of 0.85
// per token, with every pass and draft time off by up to 15% either way (a shared machine): it
// pays (about 1.2x plain decoding on average), so it is asked for the most from its first draft
// on and never paused; after reset() (the next prompt) it drafts from the first round, without a
// plain round to re-measure the costs.
void test_noisy_paying_drafter_not_paused(void **) {
  Lookahead la;
  la.configure(8, true);
  Uniform uniform{777};
  int plain = 0, asked_max = 0, rounds = 0;
  for (int text = 0; text < 4; ++text) {
    la.reset();
    for (int i = 0; i < 60; ++i, ++rounds) {
      const int32_t k = la.next();
      int32_t d = std::min<int32_t>(k, 4), a = 0;
      while (a < d && uniform() < 0.85) ++a;
      const double pass = (d == 0   ? 50.0
                           : d == 1 ? 52.0
                           : d == 2 ? 64.0
                           : d == 3 ? 75.0
                                    : 106.0) *
                          (0.85 + 0.3 * uniform());
      const double draft = d * 12.0 * (0.85 + 0.3 * uniform());
      la.observe(k, d, a, draft, pass, d + 1);
      if (k == 0) ++plain;
      if (k == 8) ++asked_max;
      if (i == 0 && text > 0) assert_int_equal(k, 8);
    }
  }
  print_message("%d rounds: %d plain, %d asked for 8\n", rounds, plain, asked_max);
  assert_true(plain <= 5);  // the first round measures a plain pass, then one refresh per 64 rounds
  assert_int_equal(asked_max, rounds - plain);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_accepted_memory_bound),
      cmocka_unit_test(test_rejections_pause),
      cmocka_unit_test(test_bursts),
      cmocka_unit_test(test_self_limiting_drafter),
      cmocka_unit_test(test_steep_passes_cap_self_limiting_drafts),
      cmocka_unit_test(test_noisy_paying_drafter_not_paused),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
