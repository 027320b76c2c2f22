// White-box tests of the static corpus index (plugins/common/corpus.h):
//  - CorpusIndex::best gives what a CountTable over the same tokens gives, for every pattern of
//    1 .. depth - 1 tokens taken from the corpus and for patterns it does not hold, at several
//    min_count and min_share (random corpora over small vocabularies, so that n-grams repeat and
//    ties occur; fixed seeds);
//  - the occurrence that ends the corpus has no follower and is not counted;
//  - patterns of depth tokens or more, and an empty corpus, give -1.
#include <cstdint>
#include <random>
#include <vector>

#include "common/corpus.h"
#include "common/ngram_index.h"

#include "support/cmocka_setup.h"

namespace {

using specinfer_ngram::CorpusIndex;
using specinfer_ngram::CountTable;

void test_matches_count_table(void **) {
  const int depth = 5;
  const uint32_t min_counts[] = {1, 2, 3};
  const double min_shares[] = {0.0, 0.3, 0.5, 0.9};
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    const int32_t vocab = 2 + static_cast<int32_t>(seed % 4) * 3;  // 2, 5, 8, 11
    std::vector<int32_t> tokens(3000 + 500 * seed);
    for (int32_t &t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    CountTable table;
    table.add(tokens.data(), tokens.size(), 1, depth - 1);
    const CorpusIndex index(tokens, depth);
    assert_int_equal(index.tokens(), tokens.size());
    int64_t checked = 0, found = 0;
    for (size_t p = 0; p + 1 < tokens.size(); p += 7) {
      for (int k = 1; k < depth && p + static_cast<size_t>(k) <= tokens.size(); ++k) {
        for (uint32_t mc : min_counts)
          for (double ms : min_shares) {
            const int32_t want = table.best(tokens.data() + p, k, mc, ms);
            const int32_t got = index.best(tokens.data() + p, k, mc, ms);
            if (want != got)
              fail_msg(
                  "seed %u, pattern at %zu of %d tokens, min_count %u, min_share %.1f: "
                  "index %d, table %d",
                  seed, p, k, mc, ms, got, want);
            ++checked;
            found += got >= 0;
          }
      }
    }
    // A token the corpus never holds: no follower.
    const int32_t absent[2] = {vocab, 0};
    assert_int_equal(index.best(absent, 2, 1, 0.0), -1);
    assert_true(found > checked / 4);  // the comparison is not between two empty answers
  }
}

void test_corpus_end_and_limits(void **) {
  // "1 2" occurs twice: once followed by 3, and once at the very end (followed by nothing).
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 1, 2};
  const CorpusIndex index(tokens, 4);
  const int32_t p12[2] = {1, 2};
  // One follower seen once: at min_share 1 it is all of what followed.
  assert_int_equal(index.best(p12, 2, 1, 1.0), 3);
  assert_int_equal(index.best(p12, 2, 2, 0.0), -1);  // seen once, not twice
  const int32_t p2[1] = {2};
  assert_int_equal(index.best(p2, 1, 1, 1.0), 3);
  const int32_t p4[1] = {4};
  assert_int_equal(index.best(p4, 1, 1, 0.5), 1);
  // Patterns of depth tokens or more are beyond the index; k = 0 is no pattern.
  const int32_t p1234[4] = {1, 2, 3, 4};
  assert_int_equal(index.best(p1234, 4, 1, 0.0), -1);
  assert_int_equal(index.best(p1234, 3, 1, 0.0), 4);
  assert_int_equal(index.best(p1234, 0, 1, 0.0), -1);

  const CorpusIndex none(std::vector<int32_t>{}, 4);
  assert_true(none.empty());
  assert_int_equal(none.best(p12, 2, 1, 0.0), -1);
  // A corpus of one token: no follower at all.
  const CorpusIndex one(std::vector<int32_t>{7}, 3);
  const int32_t p7[1] = {7};
  assert_int_equal(one.best(p7, 1, 1, 0.0), -1);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_matches_count_table),
                                     cmocka_unit_test(test_corpus_end_and_limits)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
