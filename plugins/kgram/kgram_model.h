// Shannon's k-gram language model over bytes: P(next byte | previous k bytes), trained by counting
// a text file, smoothed by interpolating each order with the one below it:
//   P_j(x | h) = (c(h, x) + s * P_{j-1}(x | h')) / (c(h) + s),  P_{-1} uniform over 256 bytes,
// where h' drops the oldest byte of h and s is the smoothing strength. Contexts never seen fall
// back to the lower order. Real, normalized probabilities; small and fast.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace specinfer_kgram {

constexpr int kVocab = 256;
constexpr int kMaxOrder = 7;

class Model {
 public:
  // Trains from the bytes of a file; throws specinfer_plugin::Failure (NOT_FOUND when the file
  // cannot be opened) or std::runtime_error with a message on failure.
  Model(const std::string &path, int order, double smoothing);
  Model(std::string_view text, int order, double smoothing);

  int order() const { return order_; }
  double smoothing() const { return smoothing_; }
  size_t training_bytes() const { return n_bytes_; }

  // The distribution of the next byte after `context` (the last min(k, n) bytes are used).
  void distribution(const uint8_t *context, size_t n, float *probs) const;

 private:
  struct Counts {
    uint32_t total = 0;
    std::vector<std::pair<uint8_t, uint32_t>> next;  // byte -> count, sparse
  };
  void train(std::string_view text);
  static uint64_t key(const uint8_t *ctx, int len);

  int order_;
  double smoothing_;
  size_t n_bytes_ = 0;
  std::array<double, kVocab> unigram_{};
  std::unordered_map<uint64_t, Counts> table_;
};

}  // namespace specinfer_kgram
