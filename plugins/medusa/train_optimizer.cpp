// Medusa head training, step 4 of train.h: the heads' forward and backward passes and minibatch
// AdamW with warm-up and cosine decay.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "f16.h"
#include "train_internal.h"

namespace medusa::train_detail {

Trainer::Trainer(const Context &cx, const Options &o, const Data &data, const Labels &labels,
                 const std::vector<float> &u, int32_t V, const TokenInput &emb, int64_t max_train)
    : cx_(cx),
      o_(o),
      data_(data),
      lab_(labels),
      u_(u),
      emb_(emb),
      H_(data.H),
      D_((1 + o.token) * data.H),
      V_(V),
      K_(o.heads),
      softmax_(cx.host()->kernels->softmax) {
  const size_t H = static_cast<size_t>(H_), D = static_cast<size_t>(D_),
               B = static_cast<size_t>(o.batch);
  const size_t R = static_cast<size_t>(o.rank);
  heads_.resize(static_cast<size_t>(K_));
  for (size_t k = 0; k < heads_.size(); ++k) {
    Head &h = heads_[k];
    h.b.init(H, false);
    if (R == 0) {
      h.w.init(H * D, true);
      h.params = {&h.w, &h.b};
    } else {
      h.a.init(H * R, true);
      h.bm.init(R * D, true);
      Rng rng(o.seed * 31 + k + 7);
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      for (float &x : h.bm.p)  // uniform with the variance of N(0, 1/D)
        x = scale * std::sqrt(3.0f) *
            (2.0f * static_cast<float>(rng.next() >> 40) / 16777216.0f - 1.0f);
      h.t.resize(B * R);
      h.dt.resize(B * R);
      h.params = {&h.a, &h.bm, &h.b};
    }
    h.z.resize(B * H);
    h.y.resize(B * H);
    h.logits.resize(B * static_cast<size_t>(V_));
    h.dy.resize(B * H);
    h.x.resize(B * D);
  }
  for (int64_t g = data.n_heldout; g < data.n && train_tokens() < max_train; ++g)
    if (g + 1 < data.end[static_cast<size_t>(g)]) train_pos_.push_back(g);
  for (int64_t g = 0; g < data.n_heldout; ++g)
    if (g + 1 < data.end[static_cast<size_t>(g)]) eval_pos_.push_back(g);
}

double Trainer::epoch(int32_t e) {
  std::vector<int64_t> order = train_pos_;
  Rng rng(o_.seed * specinfer::kSplitMix64Gamma + static_cast<uint64_t>(e) + 1);
  rng.shuffle(order);
  const int64_t total = steps_per_epoch() * o_.epochs;
  const int64_t warm = std::max<int64_t>(1, static_cast<int64_t>(o_.warmup * total));
  double epoch_loss = 0;
  int64_t epoch_n = 0;
  double recent = NAN;
  for (size_t s = 0; s < order.size(); s += static_cast<size_t>(o_.batch)) {
    const size_t nb = std::min(order.size() - s, static_cast<size_t>(o_.batch));
    load_x(order.data() + s, nb);
    double lr;
    if (step_ < warm)
      lr = o_.lr * static_cast<double>(step_ + 1) / static_cast<double>(warm);
    else
      lr = o_.lr * 0.5 *
           (1.0 + std::cos(std::numbers::pi * static_cast<double>(step_ - warm) /
                           static_cast<double>(std::max<int64_t>(1, total - warm))));
    ++step_;
    parallel(cx_.host(), K_, [&](int64_t k) {
      Head &h = heads_[static_cast<size_t>(k)];
      h.loss_sum = 0;
      h.loss_n = 0;
      forward(h, static_cast<int32_t>(k), order.data() + s, nb, true);
      backward_and_update(h, nb, lr);
    });
    double loss = 0;
    int64_t n = 0;
    for (const Head &h : heads_) {
      loss += h.loss_sum;
      n += h.loss_n;
    }
    if (n > 0) {
      const double mean = loss / static_cast<double>(n);
      recent = std::isnan(recent) ? mean : 0.95 * recent + 0.05 * mean;
      epoch_loss += loss;
      epoch_n += n;
    }
    cx_.progress("train", step_, total, recent, nullptr);
  }
  return epoch_n ? epoch_loss / static_cast<double>(epoch_n) : NAN;
}

void Trainer::load_x(const int64_t *pos, size_t nb) {
  const size_t H = static_cast<size_t>(H_), D = static_cast<size_t>(D_);
  for (size_t r = 0; r < nb; ++r) {
    const size_t g = static_cast<size_t>(pos[r]);
    const int64_t end = data_.end[g];
    const uint16_t *src = data_.hidden.data() + g * H;
    const float *h0 = heads_[0].x.data() + r * D;  // h, converted once
    for (size_t k = 0; k < heads_.size(); ++k) {
      float *dst = heads_[k].x.data() + r * D;
      if (k == 0)
        for (size_t i = 0; i < H; ++i) dst[i] = f16_to_f32(src[i]);
      else
        std::copy(h0, h0 + H, dst);
      for (int32_t j = 0; j < o_.token; ++j) {
        const int64_t t = static_cast<int64_t>(o_.token == 1 ? g + 1 : g + k + j);
        float *e = dst + H * static_cast<size_t>(1 + j);
        if (t < end)
          emb_.row(data_.token[static_cast<size_t>(t)], e);
        else
          std::fill(e, e + H, 0.0f);
      }
    }
  }
}

bool Trainer::on_path(int64_t g, int64_t k) const {
  for (int64_t i = g; i <= g + k; ++i)
    if (data_.token[static_cast<size_t>(i + 1)] != data_.top_id[static_cast<size_t>(i) * kTop])
      return false;
  return true;
}

void Trainer::forward(Head &h, int32_t k, const int64_t *pos, size_t nb, bool grad) {
  const int H = H_, D = D_, V = V_, B = static_cast<int>(nb);
  for (int r = 0; r < B; ++r)
    std::copy(h.b.p.begin(), h.b.p.end(), h.z.begin() + static_cast<ptrdiff_t>(r) * H);
  if (o_.rank == 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H, D, 1.0f, h.x.data(), D, h.w.p.data(),
                D, 1.0f, h.z.data(), H);
  } else {  // t = x B^T, z += t A^T
    const int R = o_.rank;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, R, D, 1.0f, h.x.data(), D,
                h.bm.p.data(), D, 0.0f, h.t.data(), R);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H, R, 1.0f, h.t.data(), R, h.a.p.data(),
                R, 1.0f, h.z.data(), H);
  }
  for (size_t r = 0; r < static_cast<size_t>(B); ++r)
    for (size_t i = 0; i < static_cast<size_t>(H); ++i)
      h.y[r * H + i] = h.x[r * D + i] + silu(h.z[r * H + i]);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, V, H, 1.0f, h.y.data(), H, u_.data(), H,
              0.0f, h.logits.data(), V);
  // Rows with a label, weighted: positions off the target's greedy path count `offpath`.
  double total_w = 0;
  h.weight.assign(nb, 0.0f);
  for (size_t r = 0; r < nb; ++r) {
    const int64_t s = pos[r] + k + 1;
    if (s < data_.end[static_cast<size_t>(pos[r])] && lab_.any(s)) {
      h.weight[r] = on_path(pos[r], k) ? 1.0f : static_cast<float>(o_.offpath);
      total_w += h.weight[r];
    }
  }
  for (size_t r = 0; r < nb; ++r) {
    float *row = h.logits.data() + r * static_cast<size_t>(V);
    const int64_t s = pos[r] + k + 1;
    if (s >= data_.end[static_cast<size_t>(pos[r])] || !lab_.any(s)) {
      if (grad) std::fill(row, row + V, 0.0f);
      continue;
    }
    const int32_t *idx = lab_.idx.data() + static_cast<size_t>(s) * kTop;
    const float *q = lab_.q.data() + static_cast<size_t>(s) * kTop;
    softmax_(row, V);
    double l = 0;
    for (int j = 0; j < kTop && idx[j] >= 0; ++j)
      l -= q[j] * std::log(std::max(row[idx[j]], 1e-30f));
    h.loss_sum += l;
    ++h.loss_n;
    if (grad) {
      const float scale = total_w > 0 ? h.weight[r] / static_cast<float>(total_w) : 0.0f;
      for (int v = 0; v < V; ++v) row[v] *= scale;
      for (int j = 0; j < kTop && idx[j] >= 0; ++j) row[idx[j]] -= q[j] * scale;
    }
  }
}

void Trainer::backward_and_update(Head &h, size_t nb, double lr) {
  const int H = H_, D = D_, V = V_, B = static_cast<int>(nb);
  // dy = G U; dz = dy * silu'(z); dW = dz^T x (low rank: dA = dz^T t, dt = dz A,
  // dB = dt^T x); db = sum of dz.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, V, 1.0f, h.logits.data(), V,
              u_.data(), H, 0.0f, h.dy.data(), H);
  for (size_t i = 0; i < static_cast<size_t>(B) * H; ++i) {
    const float z = h.z[i], sg = 1.0f / (1.0f + std::exp(-z));
    h.dy[i] *= sg * (1.0f + z * (1.0f - sg));
  }
  if (o_.rank == 0) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, D, B, 1.0f, h.dy.data(), H, h.x.data(),
                D, 0.0f, h.w.g.data(), D);
  } else {
    const int R = o_.rank;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, R, B, 1.0f, h.dy.data(), H, h.t.data(),
                R, 0.0f, h.a.g.data(), R);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, R, H, 1.0f, h.dy.data(), H,
                h.a.p.data(), R, 0.0f, h.dt.data(), R);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, R, D, B, 1.0f, h.dt.data(), R, h.x.data(),
                D, 0.0f, h.bm.g.data(), D);
  }
  std::fill(h.b.g.begin(), h.b.g.end(), 0.0f);
  for (int r = 0; r < B; ++r)
    for (int i = 0; i < H; ++i)
      h.b.g[static_cast<size_t>(i)] += h.dy[static_cast<size_t>(r) * H + i];
  for (Param *p : h.params) adamw(*p, lr);
}

void Trainer::matrix(const Head &h, float *w) const {
  const int H = H_, D = D_;
  if (o_.rank == 0) {
    std::copy(h.w.p.begin(), h.w.p.end(), w);
  } else {
    const int R = o_.rank;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, H, D, R, 1.0f, h.a.p.data(), R,
                h.bm.p.data(), D, 0.0f, w, D);
  }
}

void Trainer::adamw(Param &p, double lr) const {
  constexpr float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  const double t = static_cast<double>(step_);
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(b1, t)));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(b2, t)));
  const float a = static_cast<float>(lr);
  const float decay = static_cast<float>(1.0 - (p.decay ? lr * o_.wd : 0.0));
  for (size_t i = 0; i < p.p.size(); ++i) {
    const float g = p.g[i];
    p.m[i] = b1 * p.m[i] + (1.0f - b1) * g;
    p.v[i] = b2 * p.v[i] + (1.0f - b2) * g * g;
    p.p[i] = p.p[i] * decay - a * (p.m[i] * c1) / (std::sqrt(p.v[i] * c2) + eps);
  }
}

}  // namespace medusa::train_detail
