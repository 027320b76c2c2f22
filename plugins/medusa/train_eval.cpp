// Medusa head training, step 5 of train.h: the heads' accuracy on the held-out documents.
#include <algorithm>

#include "train_internal.h"

namespace medusa::train_detail {

Trainer::Eval Trainer::evaluate() {
  const size_t K = static_cast<size_t>(K_);
  std::vector<std::vector<int64_t>> hits(K, std::vector<int64_t>(kRanks, 0));
  std::vector<int64_t> n_path(K, 0), hit_all(K, 0), n_all(K, 0);
  double loss = 0;
  int64_t loss_n = 0;
  // The rank of the target's top-1 among the logits of rows [0, nb) of h, as head k's guesses.
  auto score = [&](const Head &h, int64_t k, const int64_t *pos, size_t nb) {
    const size_t kk = static_cast<size_t>(k);
    for (size_t r = 0; r < nb; ++r) {
      const int64_t g = pos[r], s2 = g + k + 1;
      if (s2 >= data_.end[static_cast<size_t>(g)]) continue;
      const bool path = on_path(g, k);
      const int32_t want = lab_.top[static_cast<size_t>(s2)];
      int64_t rank = kRanks;
      if (want >= 0) {
        const float *row = h.logits.data() + r * static_cast<size_t>(V_);
        const float lw = row[want];
        rank = 0;
        for (int32_t v = 0; v < V_ && rank < kRanks; ++v)
          rank += row[v] > lw || (row[v] == lw && v < want);
      }
      ++n_all[kk];
      hit_all[kk] += rank == 0;
      if (path) {
        ++n_path[kk];
        if (rank < kRanks) ++hits[kk][static_cast<size_t>(rank)];
      }
    }
  };
  for (size_t s = 0; s < eval_pos_.size(); s += static_cast<size_t>(o_.batch)) {
    const size_t nb = std::min(eval_pos_.size() - s, static_cast<size_t>(o_.batch));
    const int64_t *pos = eval_pos_.data() + s;
    load_x(pos, nb);
    parallel(cx_.host(), K_, [&](int64_t k) {
      Head &h = heads_[static_cast<size_t>(k)];
      h.loss_sum = 0;
      h.loss_n = 0;
      forward(h, static_cast<int32_t>(k), pos, nb, false);
      score(h, k, pos, nb);
    });
    for (const Head &h : heads_) {
      loss += h.loss_sum;
      loss_n += h.loss_n;
    }
  }
  Eval ev;
  ev.accuracy.assign(K * kRanks, 0.0f);
  ev.top1.assign(K, 0.0f);
  ev.top1_all.assign(K, 0.0f);
  ev.n_path = n_path;
  for (size_t k = 0; k < K; ++k) {
    for (int r = 0; r < kRanks; ++r)
      ev.accuracy[k * kRanks + r] =
          n_path[k] ? static_cast<float>(hits[k][static_cast<size_t>(r)]) / n_path[k] : 0.0f;
    ev.top1[k] = ev.accuracy[k * kRanks];
    ev.top1_all[k] = n_all[k] ? static_cast<float>(hit_all[k]) / n_all[k] : 0.0f;
  }
  ev.loss = loss_n ? loss / static_cast<double>(loss_n) : NAN;
  return ev;
}

}  // namespace medusa::train_detail
