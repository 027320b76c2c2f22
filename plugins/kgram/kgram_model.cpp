#include "kgram_model.h"

#include "../../common/fault_point.h"
#include "../common/plugin_error.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

namespace specinfer_kgram {

Model::Model(const std::string &path, int order, double smoothing)
    : order_(order), smoothing_(smoothing) {
  std::ifstream in;
  if (!specinfer::fault_injected(specinfer::FAULT_READ)) in.open(path, std::ios::binary);
  if (!in)
    throw specinfer_plugin::Failure(SPECINFER_ERR_NOT_FOUND,
                                    "cannot open training text '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad() || specinfer::fault_injected(specinfer::FAULT_READ))
    throw specinfer_plugin::Failure(SPECINFER_ERR_IO, "cannot read training text '" + path + "'");
  if (text.empty()) throw std::runtime_error("training text '" + path + "' is empty");
  train(text);
}

Model::Model(std::string_view text, int order, double smoothing)
    : order_(order), smoothing_(smoothing) {
  if (text.empty()) throw std::runtime_error("training text is empty");
  train(text);
}

uint64_t Model::key(const uint8_t *ctx, int len) {
  // Up to 7 context bytes and the length fit one 64-bit key exactly: no collisions.
  uint64_t k = static_cast<uint64_t>(len) << 56;
  for (int i = 0; i < len; ++i) k |= static_cast<uint64_t>(ctx[i]) << (8 * i);
  return k;
}

void Model::train(std::string_view text) {
  if (order_ < 1 || order_ > kMaxOrder)
    throw std::runtime_error("k must be in [1, " + std::to_string(kMaxOrder) + "]");
  if (!(smoothing_ > 0)) throw std::runtime_error("smoothing must be > 0");
  n_bytes_ = text.size();
  const auto *b = reinterpret_cast<const uint8_t *>(text.data());
  std::array<uint64_t, kVocab> uni{};
  for (size_t i = 0; i < text.size(); ++i) {
    uni[b[i]]++;
    for (int len = 1; len <= order_ && static_cast<size_t>(len) <= i; ++len) {
      Counts &c = table_[key(b + i - len, len)];
      c.total++;
      auto it =
          std::find_if(c.next.begin(), c.next.end(), [&](auto &p) { return p.first == b[i]; });
      if (it == c.next.end())
        c.next.emplace_back(b[i], 1u);
      else
        it->second++;
    }
  }
  double n = static_cast<double>(text.size());
  for (int x = 0; x < kVocab; ++x) unigram_[x] = (uni[x] + smoothing_ / kVocab) / (n + smoothing_);
}

void Model::distribution(const uint8_t *context, size_t n, float *probs) const {
  std::array<double, kVocab> p = unigram_;
  int max_len = static_cast<int>(std::min<size_t>(n, static_cast<size_t>(order_)));
  for (int len = 1; len <= max_len; ++len) {
    auto it = table_.find(key(context + n - len, len));
    if (it == table_.end()) break;  // a longer context containing this one was never seen either
    const Counts &c = it->second;
    double denom = c.total + smoothing_;
    for (int x = 0; x < kVocab; ++x) p[x] *= smoothing_;
    for (auto &[byte, count] : c.next) p[byte] += count;
    for (int x = 0; x < kVocab; ++x) p[x] /= denom;
  }
  for (int x = 0; x < kVocab; ++x) probs[x] = static_cast<float>(p[x]);
}

}  // namespace specinfer_kgram
