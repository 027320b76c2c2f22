// The attention driver (streaming softmax over key blocks, split-K chunks merged in key order),
// the scalar kernels it is checked against, and kv_store.
#include "backend/attention.h"

#include "backend/attention_sketch.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "backend/ops.h"
#include "backend/quant.h"
#include "util/error.h"

namespace specinfer {

namespace {

// ---- scalar kernels ------------------------------------------------------------------------

// Row j's hd values as floats.
void load_row(int32_t type, const uint8_t *row, int64_t hd, float *out) {
  switch (type) {
    case SPECINFER_WTYPE_F32:
      std::memcpy(out, row, size_t(hd) * sizeof(float));
      return;
    case SPECINFER_WTYPE_F16:
      for (int64_t i = 0; i < hd; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        out[i] = fp16_to_fp32(h);
      }
      return;
    case SPECINFER_WTYPE_Q8_0:
      for (int64_t b = 0; b < hd / kQK; ++b) {
        BlockQ8_0 blk;
        std::memcpy(&blk, row + size_t(b) * sizeof blk, sizeof blk);
        const float d = fp16_to_fp32(blk.d);
        for (int i = 0; i < kQK; ++i) out[b * kQK + i] = d * static_cast<float>(blk.qs[i]);
      }
      return;
    default:  // Q4_0 (the driver admits nothing else)
      for (int64_t b = 0; b < hd / kQK; ++b) {
        BlockQ4_0 blk;
        std::memcpy(&blk, row + size_t(b) * sizeof blk, sizeof blk);
        const float d = fp16_to_fp32(blk.d);
        for (int i = 0; i < kQK / 2; ++i) {
          out[b * kQK + i] = d * static_cast<float>((blk.qs[i] & 0x0F) - 8);
          out[b * kQK + i + kQK / 2] = d * static_cast<float>((blk.qs[i] >> 4) - 8);
        }
      }
      return;
  }
}

void scores_s(int32_t type, const float *q, int64_t g, const uint8_t *const *rows, int64_t n,
              int64_t hd, float scale, float *s, int64_t s_stride, float *s_max) {
  std::vector<float> x(static_cast<size_t>(hd));
  for (int64_t h = 0; h < g; ++h) s_max[h] = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    load_row(type, rows[j], hd, x.data());
    for (int64_t h = 0; h < g; ++h) {
      double acc = 0.0;
      for (int64_t d = 0; d < hd; ++d) acc += static_cast<double>(q[h * hd + d]) * x[size_t(d)];
      s[h * s_stride + j] = static_cast<float>(acc) * scale;
      s_max[h] = std::max(s_max[h], s[h * s_stride + j]);
    }
  }
}

void accumulate_s(int32_t type, const float *p, int64_t p_stride, int64_t g,
                  const uint8_t *const *rows, int64_t n, int64_t hd, float *o) {
  std::vector<float> x(static_cast<size_t>(hd));
  for (int64_t j = 0; j < n; ++j) {
    load_row(type, rows[j], hd, x.data());
    for (int64_t h = 0; h < g; ++h) {
      const float pj = p[h * p_stride + j];
      for (int64_t d = 0; d < hd; ++d) o[h * hd + d] += pj * x[size_t(d)];
    }
  }
}

void scores_tile_s(const int8_t *qs, const float *qd, const int32_t *bias, int64_t g,
                   const uint8_t *tile, int64_t hd, float scale, int l0, int l1, float *s,
                   int64_t s_stride, float *s_max) {
  const int64_t nb = hd / kQK;
  for (int64_t h = 0; h < g; ++h)
    for (int l = l0; l < l1; ++l) {
      float f = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = tile + b * kKeyTileBlock;
        const int8_t *q = qs + h * hd + b * kQK;
        int32_t acc = bias[h * nb + b];
        for (int i = 0; i < kQK; ++i) acc += int32_t(blk[32 + 64 * (i / 4) + 4 * l + i % 4]) * q[i];
        uint16_t dk;
        std::memcpy(&dk, blk + 2 * l, 2);
        f = std::fma(float(acc), fp16_to_fp32(dk) * qd[h * nb + b], f);
      }
      const float v = f * scale;
      s[h * s_stride + (l - l0)] = v;
      s_max[h] = std::max(s_max[h], v);
    }
}

// ---- the driver ----------------------------------------------------------------------------

// The keys one query sees, in order: a run of consecutive slots [first, first + run) and then the
// slots listed in tail (a tree's nodes, or any other mask's scattered keys).
struct View {
  int64_t first = 0, run = 0;
  const int32_t *tail = nullptr;
  int64_t n_tail = 0;
  // Keys [s0, s1) of the view whose exact scores are already known (sketched attention's rescored
  // picks): head h's score of key t at scores[h * s_stride + t - s0], the bits the score kernel
  // gives them.
  const float *scores = nullptr;
  int64_t s0 = 0, s1 = 0, s_stride = 0;
  int64_t size() const { return run + n_tail; }
  int64_t slot(int64_t t) const { return t < run ? first + t : tail[t - run]; }
};

// Everything one call shares between its tasks.
struct Call {
  const specinfer_attention_args *a;
  const VecOps *vec;
  const AttnKernels *kern;
  int32_t k_type, v_type;
  int64_t hd, g, hkv;
  size_t k_head_bytes, v_head_bytes;  // one head's row
  const uint8_t *k, *v;
  // Bytes from a row to the next position's and to the next kv head's (specinfer_attention_args's
  // strides, or those of rows back to back by position).
  size_t k_pos, k_head, v_pos, v_head;
  std::vector<View> views;  // per query
  // Sketched attention: the key sketches, and per (query, kv head) the keys picked (item_views,
  // their slots in picked); empty item_views = exact attention, every view per query.
  const uint8_t *ks = nullptr;
  size_t ks_row = 0;
  int32_t bits = 0;
  int64_t n_select = 0, n_window = 0, n_sink = 0, n_rescore = 0;
  std::vector<View> item_views;
  std::vector<int32_t> picked;
  // With rescoring, for few queries: per item, the exact scores of its rescored picks
  // ([g][n_select] floats), which the attention over them then reuses instead of scoring those keys
  // again.
  std::vector<float> picked_scores;
  // Keys in Q8_0 tiles (specinfer_attention_args.k_tile): the queries rounded for them, row
  // qi * n_head + h of each.
  bool k_tiled = false;
  std::vector<int8_t> q8;
  std::vector<float> q8_d;
  std::vector<int32_t> q8_bias;
};

// A tile's query rows rounded for key tiles (row h at qs + h * hd, d and bias + h * hd / 32).
struct QuantRows {
  const int8_t *qs = nullptr;
  const float *d = nullptr;
  const int32_t *bias = nullptr;
};

// Asks for the `bytes` bytes at p to be brought into L2.
inline void prefetch_l2(const uint8_t *p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
  __builtin_prefetch(p + bytes - 1, 0, 2);
}

// With several queries a run's keys cost more arithmetic than their bytes take to arrive, and the
// hardware prefetchers, running only a little ahead of the loads, leave the kernels waiting on
// memory for each block and then the memory idle while they compute. So each tile scored for more
// than one query asks for the keys and values this many positions on into L2 (a tile at a time,
// spread over the work).
constexpr int64_t kPrefetchKeys = 128;

// Asks for the 16 keys and values from slot `at` into L2 when they lie in view v's run (kb, vb: the
// kv head's rows, one after another by position). Always inlined: GCC kept it out of line, and the
// call per tile made a 5-query pass at 16k about 15% slower.
[[gnu::always_inline]] inline void prefetch_run_tile(const Call &c, const View &v,
                                                     const uint8_t *kb, const uint8_t *vb,
                                                     int64_t at) {
  if (at + SPECINFER_KEY_TILE > v.first + v.run) return;
  prefetch_l2(kb + size_t(at) * c.k_pos, SPECINFER_KEY_TILE * c.k_head_bytes);
  prefetch_l2(vb + size_t(at) * c.v_pos, SPECINFER_KEY_TILE * c.v_head_bytes);
}

// Scores of keys [b0, b0 + n) of view v for the nr query rows q (Q8_0 key tiles): runs of
// consecutive slots straight from their tiles, listed slots gathered into a tile of their own.
// Either way a key's score is the same bits. With vb (the values of the same kv head, its rows one
// after another as the keys' are), each run tile prefetches kPrefetchKeys ahead.
void scores_tiled(const Call &c, const View &v, const QuantRows &q, int64_t nr, const uint8_t *kb,
                  int64_t b0, int64_t n, float *s, float *s_max, const uint8_t *vb = nullptr) {
  thread_local std::vector<uint8_t> gathered;
  for (int64_t h = 0; h < nr; ++h) s_max[h] = -std::numeric_limits<float>::infinity();
  const int64_t hd = c.hd;
  for (int64_t j = 0; j < n;) {
    const int64_t t = b0 + j;
    if (t < v.run) {
      const int64_t slot = v.first + t, lane = slot % SPECINFER_KEY_TILE;
      const int64_t take = std::min({n - j, SPECINFER_KEY_TILE - lane, v.run - t});
      c.kern->scores_tile(q.qs, q.d, q.bias, nr, kb + size_t(slot - lane) * c.k_pos, hd, c.a->scale,
                          int(lane), int(lane + take), s + j, kAttnBlock, s_max);
      if (vb != nullptr) prefetch_run_tile(c, v, kb, vb, slot - lane + kPrefetchKeys);
      j += take;
      continue;
    }
    const int64_t take = std::min<int64_t>(n - j, SPECINFER_KEY_TILE);
    gathered.resize(c.k_head_bytes * SPECINFER_KEY_TILE);
    for (int64_t i = 0; i < take; ++i) {
      const auto slot = int64_t(v.slot(t + i)), lane = slot % SPECINFER_KEY_TILE;
      specinfer_key_tile_move(kb + size_t(slot - lane) * c.k_pos, int(lane), gathered.data(),
                              int(i), hd);
    }
    c.kern->scores_tile(q.qs, q.d, q.bias, nr, gathered.data(), hd, c.a->scale, 0, int(take), s + j,
                        kAttnBlock, s_max);
    j += take;
  }
}

const View &view_of(const Call &c, int64_t qi, int64_t kvh) {
  return c.item_views.empty() ? c.views[size_t(qi)] : c.item_views[size_t(qi * c.hkv + kvh)];
}

// A partial result over some keys for rows of query heads (a query's g heads of one kv head are g
// rows): running max m, sum l of exp(score - m), and o = sum exp(score - m) * value.
struct State {
  float *m, *l, *o;
};

// Up to this many consecutive queries share a task. The key blocks they all see at the same slots
// are read once for all of them: a verify batch or a prefill chunk streams a long cache once per
// tile instead of once per query.
constexpr int64_t kTileQueries = 8;

size_t state_floats(const Call &c, int64_t nq) {
  return size_t(nq * c.g) * size_t(c.hd + 2);
}
State state_at(const Call &c, float *p, int64_t nq) {
  const int64_t rows = nq * c.g;
  return State{p, p + rows, p + 2 * rows};
}
// Query t's rows of a tile's state.
State rows_of(const Call &c, State s, int64_t t) {
  return State{s.m + t * c.g, s.l + t * c.g, s.o + t * c.g * c.hd};
}

// One streaming-softmax step for `rows` rows over a block of nb keys: row r's scores are
// s[r * kAttnBlock ..], their largest mp[r]; the scores become the weights exp(score - m).
void absorb(const Call &c, float *s, const float *mp, int64_t rows, int64_t nb, State st) {
  for (int64_t h = 0; h < rows; ++h) {
    float *sh = s + h * kAttnBlock;
    const float mb = std::max(st.m[h], mp[h]);
    if (mb == -std::numeric_limits<float>::infinity()) {  // nothing finite yet
      std::fill(sh, sh + nb, 0.0f);
      continue;
    }
    const float sum = c.vec->exp_sub_sum(sh, mb, nb);
    if (mb != st.m[h]) {
      const float r = std::exp(st.m[h] - mb);  // 0 for the first finite block
      st.l[h] *= r;
      c.vec->scale(st.o + h * c.hd, r, c.hd);
      st.m[h] = mb;
    }
    st.l[h] += sum;
  }
}

// The rows of queries q0 .. q0 + nq of a tile on kv head kvh, one after another, into *q (and,
// for key tiles, rounded into *q8): in place when they are (one query, or one kv head), else
// gathered into this thread's buffers.
void tile_queries(const Call &c, int64_t q0, int64_t nq, int64_t kvh, const float **q_out,
                  QuantRows *q8_out) {
  const specinfer_attention_args &a = *c.a;
  const int64_t g = c.g, hd = c.hd, rows = nq * g;
  thread_local std::vector<float> qbuf, dbuf;
  thread_local std::vector<int8_t> q8buf;
  thread_local std::vector<int32_t> biasbuf;
  const int64_t r0 = q0 * a.n_head + kvh * g, nb = hd / 32;
  const float *q = a.q + r0 * hd;
  QuantRows q8;
  if (c.k_tiled)
    q8 = QuantRows{c.q8.data() + r0 * hd, c.q8_d.data() + r0 * nb, c.q8_bias.data() + r0 * nb};
  if (nq > 1 && c.hkv > 1) {
    qbuf.resize(size_t(rows * hd));
    for (int64_t t = 0; t < nq; ++t)
      std::memcpy(qbuf.data() + t * g * hd, q + t * a.n_head * hd, size_t(g * hd) * sizeof(float));
    q = qbuf.data();
    if (c.k_tiled) {
      q8buf.resize(size_t(rows * hd));
      dbuf.resize(size_t(rows * nb));
      biasbuf.resize(size_t(rows * nb));
      for (int64_t t = 0; t < nq; ++t) {
        const size_t from = size_t(t * a.n_head), to = size_t(t * g);
        std::memcpy(q8buf.data() + to * hd, q8.qs + from * hd, size_t(g * hd));
        std::memcpy(dbuf.data() + to * nb, q8.d + from * nb, size_t(g * nb) * sizeof(float));
        std::memcpy(biasbuf.data() + to * nb, q8.bias + from * nb,
                    size_t(g * nb) * sizeof(int32_t));
      }
      q8 = QuantRows{q8buf.data(), dbuf.data(), biasbuf.data()};
    }
  }
  *q_out = q;
  *q8_out = q8;
}

// Listed keys come from scattered rows, which the kernels' own prefetches (a few rows ahead)
// reach too late: the listed rows of view v's block from t on are asked into L2 while the current
// one runs (keys in rows only, and not those whose scores the view holds). A run streams in order,
// which the hardware prefetchers follow.
[[gnu::always_inline]] inline void prefetch_listed(const Call &c, const View &v, int64_t t,
                                                   const uint8_t *kb, const uint8_t *vb) {
  const int64_t end = std::min(v.size(), t + kAttnBlock);
  for (t = std::max(t, v.run); t < end; ++t) {
    const auto slot = size_t(v.slot(t));
    if (!c.k_tiled && (t < v.s0 || t >= v.s1)) prefetch_l2(kb + slot * c.k_pos, c.k_head_bytes);
    prefetch_l2(vb + slot * c.v_pos, c.v_head_bytes);
  }
}

// The exact scores view v holds for keys [b0 + k0, b0 + k1) into rows of sp (kAttnBlock apart)
// at k0 .., their largest per row into mp.
[[gnu::always_inline]] inline void copy_held_scores(const View &v, int64_t nr, int64_t b0,
                                                    int64_t k0, int64_t k1, float *sp, float *mp) {
  for (int64_t h = 0; h < nr; ++h) {
    const float *from = v.scores + h * v.s_stride + (b0 + k0 - v.s0);
    float *to = sp + h * kAttnBlock;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = k0; j < k1; ++j) {
      to[j] = from[j - k0];
      m = std::max(m, to[j]);
    }
    mp[h] = m;
  }
}

// The fresh state of queries q0 .. q0 + nq (nq <= kTileQueries), kv head kvh, over the keys each
// sees among its visible positions [t0, t0 + kAttnChunk). A block that every query of the tile sees
// at the same slots is scored and accumulated for all their rows at once; any other block query
// by query. Either way a query meets the blocks it would meet alone, and the kernels treat each row
// alike whatever shares the call, so its result is the same bits.
void run_tile(const Call &c, int64_t q0, int64_t nq, int64_t kvh, int64_t t0, State st) {
  const specinfer_attention_args &a = *c.a;
  const int64_t g = c.g, hd = c.hd, rows = nq * g;
  const View *views[kTileQueries];
  int64_t t1[kTileQueries];
  int64_t t_end = t0, shared = std::numeric_limits<int64_t>::max();
  for (int64_t t = 0; t < nq; ++t) {
    views[t] = &view_of(c, q0 + t, kvh);
    t1[t] = std::min(views[t]->size(), t0 + kAttnChunk);
    t_end = std::max(t_end, t1[t]);
    shared = views[t]->first == views[0]->first ? std::min(shared, views[t]->run) : 0;
  }
  const int64_t nb = hd / 32;
  const float *q = nullptr;
  QuantRows q8;
  tile_queries(c, q0, nq, kvh, &q, &q8);
  thread_local std::vector<float> sbuf, pbuf, mbuf;
  sbuf.resize(size_t(rows * (kAttnBlock + 1)));
  float *sp = sbuf.data(), *mp = sp + rows * kAttnBlock;
  for (int64_t h = 0; h < rows; ++h) {
    st.m[h] = -std::numeric_limits<float>::infinity();
    st.l[h] = 0.0f;
  }
  std::fill(st.o, st.o + rows * hd, 0.0f);
  const uint8_t *kb = c.k + size_t(kvh) * c.k_head, *vb = c.v + size_t(kvh) * c.v_head;
  const uint8_t *krows[kAttnBlock], *vrows[kAttnBlock];
  // Keys [b0, b0 + n) of view v are scored and accumulated for rows [r, r + nr) of the tile by
  // step(). Rows one after another by position (a head-major cache): a run can be prefetched ahead.
  const bool head_major = c.k_pos == c.k_head_bytes && c.v_pos == c.v_head_bytes;
  // Scores of keys [b0 + j0, b0 + j1) of view v into sp + j0, their largest per row into m.
  const auto score = [&](const View &v, int64_t r, int64_t nr, int64_t b0, int64_t j0, int64_t j1,
                         float *m) {
    if (c.k_tiled)
      scores_tiled(c, v, QuantRows{q8.qs + r * hd, q8.d + r * nb, q8.bias + r * nb}, nr, kb,
                   b0 + j0, j1 - j0, sp + j0, m,
                   nr > g && c.v_pos == c.v_head_bytes ? vb : nullptr);
    else if (nr == g || !head_major)
      c.kern->scores(c.k_type, q + r * hd, nr, krows + j0, j1 - j0, hd, a.scale, sp + j0,
                     kAttnBlock, m);
    else  // several queries over rows one after another: 16 keys a call, prefetching as above
      for (int64_t i0 = j0; i0 < j1; i0 += SPECINFER_KEY_TILE) {
        const int64_t i1 = std::min(j1, i0 + SPECINFER_KEY_TILE);
        mbuf.resize(size_t(nr));
        float *mt = i0 == j0 ? m : mbuf.data();
        c.kern->scores(c.k_type, q + r * hd, nr, krows + i0, i1 - i0, hd, a.scale, sp + i0,
                       kAttnBlock, mt);
        if (mt != m)
          for (int64_t h = 0; h < nr; ++h) m[h] = std::max(m[h], mt[h]);
        prefetch_run_tile(c, v, kb, vb, v.first + b0 + i0 + kPrefetchKeys);
      }
  };
  const auto step = [&](const View &v, int64_t r, int64_t nr, int64_t b0, int64_t n, State s) {
    for (int64_t j = 0; j < n; ++j) {
      const auto slot = size_t(v.slot(b0 + j));
      if (!c.k_tiled) krows[j] = kb + slot * c.k_pos;
      vrows[j] = vb + slot * c.v_pos;
    }
    if (b0 + n + kAttnBlock > v.run) prefetch_listed(c, v, b0 + n, kb, vb);
    // Keys whose exact scores the view holds are copied, the rest scored.
    const int64_t k0 = std::clamp(v.s0 - b0, int64_t(0), n), k1 = std::clamp(v.s1 - b0, k0, n);
    if (v.scores == nullptr || k0 == k1) {
      score(v, r, nr, b0, 0, n, mp);
    } else {
      copy_held_scores(v, nr, b0, k0, k1, sp, mp);
      pbuf.resize(size_t(nr));
      for (const auto &[j0, j1] : {std::pair{int64_t(0), k0}, std::pair{k1, n}}) {
        if (j0 == j1) continue;
        score(v, r, nr, b0, j0, j1, pbuf.data());
        for (int64_t h = 0; h < nr; ++h) mp[h] = std::max(mp[h], pbuf[size_t(h)]);
      }
    }
    absorb(c, sp, mp, nr, n, s);
    c.kern->accumulate(c.v_type, sp, kAttnBlock, nr, vrows, n, hd, s.o);
  };
  for (int64_t b0 = t0; b0 < t_end; b0 += kAttnBlock) {
    const int64_t n_b = std::min(kAttnBlock, t_end - b0);
    if (b0 + n_b <= shared) {  // every query sees these keys, at the same slots
      step(*views[0], 0, rows, b0, n_b, st);
      continue;
    }
    for (int64_t t = 0; t < nq; ++t) {
      const int64_t n = std::min(n_b, t1[t] - b0);
      if (n > 0) step(*views[t], t * g, g, b0, n, rows_of(c, st, t));
    }
  }
}

// into = into ⊕ from (from's keys follow into's), for one query's g rows.
void merge(const Call &c, State into, State from) {
  for (int64_t h = 0; h < c.g; ++h) {
    const float m = std::max(into.m[h], from.m[h]);
    if (m == -std::numeric_limits<float>::infinity()) continue;
    const float ra = std::exp(into.m[h] - m), rb = std::exp(from.m[h] - m);
    into.l[h] = into.l[h] * ra + from.l[h] * rb;
    float *o = into.o + h * c.hd;
    const float *p = from.o + h * c.hd;
    for (int64_t d = 0; d < c.hd; ++d) o[d] = o[d] * ra + p[d] * rb;
    into.m[h] = m;
  }
}

// Writes query qi's output for kv head kvh's heads from its state (zeros for a query that sees no
// key: st.m = NULL).
void finish(const Call &c, int64_t qi, int64_t kvh, State st) {
  const specinfer_attention_args &a = *c.a;
  float *out = a.out + (qi * a.n_head + kvh * c.g) * c.hd;
  for (int64_t h = 0; h < c.g; ++h) {
    const bool any =
        st.m != nullptr && st.m[h] != -std::numeric_limits<float>::infinity() && st.l[h] > 0.0f;
    const float inv = any ? 1.0f / st.l[h] : 0.0f;
    for (int64_t d = 0; d < c.hd; ++d) out[h * c.hd + d] = any ? st.o[h * c.hd + d] * inv : 0.0f;
  }
}

// The k-th largest of s (1 <= k <= s.size()). Many scores, at most half picked: the scores at a
// fixed stride give a value `lo` that, with a margin of four standard deviations, at least k scores
// reach; the k-th largest is then the k-th largest of the scores >= lo. Should the sample mislead
// (fewer than k reach lo), all scores are searched, so the result never depends on the sample.
float kth_largest(const std::vector<float> &s, int64_t k) {
  const auto n = int64_t(s.size());
  thread_local std::vector<float> v;
  bool found = false;
  if (n >= 4096 && 2 * k <= n) {
    const int64_t step = n / 1024, m = n / step;
    v.resize(size_t(m));
    for (int64_t i = 0; i < m; ++i) v[size_t(i)] = s[size_t(i * step)];
    const double mean = double(k) * double(m) / double(n);
    const int64_t r = std::min(m - 1, int64_t(mean + 4.0 * std::sqrt(mean)) + 8);
    std::nth_element(v.begin(), v.begin() + r, v.end(), std::greater<float>());
    const float lo = v[size_t(r)];
    v.resize(size_t(n));
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i) {  // branch-free: which scores pass is unpredictable
      v[size_t(c)] = s[size_t(i)];
      c += s[size_t(i)] >= lo;
    }
    v.resize(size_t(c));
    found = c >= k;
  }
  if (!found) v.assign(s.begin(), s.end());
  std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<float>());
  return v[size_t(k - 1)];
}

// Calls keep(i) for the indices of the k largest of s (1 <= k <= s.size()) in increasing order;
// ties at the threshold go to the earlier ones.
template <class Keep>
void for_largest(const std::vector<float> &s, int64_t k, Keep keep) {
  const float thr = kth_largest(s, k);
  const auto n = int64_t(s.size());
  int64_t above = 0, at = 0;
  for (const float x : s) {
    above += x > thr;
    at += x == thr;
  }
  thread_local std::vector<int32_t> idx;
  idx.resize(size_t(n));
  int64_t c = 0;
  if (above + at == k) {  // no tie to break: every score >= thr stays, found without branches
    for (int64_t i = 0; i < n; ++i) {
      idx[size_t(c)] = int32_t(i);
      c += s[size_t(i)] >= thr;
    }
  } else {
    int64_t ties = k - above;
    for (int64_t i = 0; i < n; ++i)
      if (s[size_t(i)] > thr || (s[size_t(i)] == thr && ties-- > 0)) idx[size_t(c++)] = int32_t(i);
  }
  for (int64_t j = 0; j < c; ++j) keep(int64_t(idx[size_t(j)]));
}

// e[j] = how close candidate key cand[j] of kv head kvh comes, by its exact score (the attention
// kernels', so a key's is the same bits in any call), to the largest score over the candidates of
// one of query qi's heads: the largest over those heads of score - that head's largest (<= 0).
// The exact scores themselves go to ex[h * cand.size() + j].
void exact_closeness(const Call &c, int64_t qi, int64_t kvh, const std::vector<int32_t> &cand,
                     std::vector<float> &e, std::vector<float> &ex) {
  const specinfer_attention_args &a = *c.a;
  const int64_t nc = int64_t(cand.size()), g = c.g;
  thread_local std::vector<float> best, sblk;
  ex.resize(size_t(g * nc));
  best.assign(size_t(g), -std::numeric_limits<float>::infinity());
  sblk.resize(size_t(g * (kAttnBlock + 1)));
  const uint8_t *keys = c.k + size_t(kvh) * c.k_head;
  const int64_t r0 = qi * a.n_head + kvh * g, nb = c.hd / 32;
  View cv;
  cv.tail = cand.data();
  cv.n_tail = nc;
  for (int64_t b0 = 0; b0 < nc; b0 += kAttnBlock) {
    const int64_t m = std::min(kAttnBlock, nc - b0);
    float *sp = sblk.data(), *mp = sp + g * kAttnBlock;
    if (c.k_tiled) {
      scores_tiled(
          c, cv,
          QuantRows{c.q8.data() + r0 * c.hd, c.q8_d.data() + r0 * nb, c.q8_bias.data() + r0 * nb},
          g, keys, b0, m, sp, mp);
    } else {
      const uint8_t *rows[kAttnBlock];
      for (int64_t j = 0; j < m; ++j) rows[j] = keys + size_t(cand[size_t(b0 + j)]) * c.k_pos;
      // The next block's rows into L2 while this one is scored (as in run_tile).
      for (int64_t j = b0 + kAttnBlock; j < std::min(nc, b0 + 2 * kAttnBlock); ++j)
        prefetch_l2(keys + size_t(cand[size_t(j)]) * c.k_pos, c.k_head_bytes);
      c.kern->scores(c.k_type, a.q + r0 * c.hd, g, rows, m, c.hd, a.scale, sp, kAttnBlock, mp);
    }
    for (int64_t h = 0; h < g; ++h) {
      std::memcpy(ex.data() + h * nc + b0, sp + h * kAttnBlock, size_t(m) * sizeof(float));
      best[size_t(h)] = std::max(best[size_t(h)], mp[h]);
    }
  }
  e.assign(size_t(nc), -std::numeric_limits<float>::infinity());
  for (int64_t h = 0; h < g; ++h)
    for (int64_t j = 0; j < nc; ++j)
      e[size_t(j)] = std::max(e[size_t(j)], ex[size_t(h * nc + j)] - best[size_t(h)]);
}

// Picks the keys query qi attends to through kv head kvh (sketched attention): its first n_sink
// and last n_window visible keys, and the n_select others of largest estimated score, in the
// order the query sees them. Ties at the threshold go to the earlier keys. With n_rescore >
// n_select, the n_rescore of largest estimate are candidates and the n_select of them closest to
// their query head's largest exact score (exact_closeness) stay.
void pick_keys(Call &c, int64_t qi, int64_t kvh, SketchScoreFn score) {
  const specinfer_attention_args &a = *c.a;
  const View &vw = c.views[size_t(qi)];
  View &out = c.item_views[size_t(qi * c.hkv + kvh)];
  const int64_t n_vis = vw.size(), total = c.n_sink + c.n_select + c.n_window;
  if (n_vis <= total) {
    out = vw;
    return;
  }
  std::vector<float> tables(size_t(c.g) * size_t(c.bits) * 4);
  sketch_query_tables(a.q + (qi * a.n_head + kvh * c.g) * c.hd, c.g, c.hd, c.bits, tables.data());
  const int64_t t0 = c.n_sink, t1 = n_vis - c.n_window;
  std::vector<float> s(size_t(t1 - t0));
  const size_t stride = c.ks_row * size_t(c.hkv);
  const uint8_t *kb = c.ks + size_t(kvh) * c.ks_row;
  const int64_t run_end = std::min(t1, vw.run);
  if (run_end > t0)
    score(tables.data(), c.g, c.bits, kb + size_t(vw.first + t0) * stride, stride, run_end - t0,
          s.data());
  for (int64_t t = std::max(t0, vw.run); t < t1; ++t)
    score(tables.data(), c.g, c.bits, kb + size_t(vw.slot(t)) * stride, stride, 1,
          s.data() + (t - t0));
  int32_t *list = c.picked.data() + (qi * c.hkv + kvh) * total;
  int64_t n = 0;
  for (int64_t t = 0; t < t0; ++t) list[n++] = int32_t(vw.slot(t));
  const int64_t n_cand = std::min(t1 - t0, std::max(c.n_select, c.n_rescore));
  const float *scored = nullptr;
  int64_t n_scored = 0;
  if (n_cand == c.n_select) {
    for_largest(s, n_cand, [&](int64_t i) { list[n++] = int32_t(vw.slot(t0 + i)); });
  } else {
    thread_local std::vector<int32_t> cand;
    thread_local std::vector<float> e, ex;
    cand.clear();
    for_largest(s, n_cand, [&](int64_t i) { cand.push_back(int32_t(vw.slot(t0 + i))); });
    exact_closeness(c, qi, kvh, cand, e, ex);
    float *kept = c.picked_scores.empty()
                      ? nullptr
                      : c.picked_scores.data() + (qi * c.hkv + kvh) * c.g * c.n_select;
    const auto nc = int64_t(cand.size());
    const int64_t at = n;
    for_largest(e, c.n_select, [&](int64_t j) {
      if (kept != nullptr)
        for (int64_t h = 0; h < c.g; ++h) kept[h * c.n_select + n - t0] = ex[size_t(h * nc + j)];
      list[n++] = cand[size_t(j)];
    });
    scored = kept;
    n_scored = n - at;
  }
  for (int64_t t = t1; t < n_vis; ++t) list[n++] = int32_t(vw.slot(t));
  out = View{};
  out.tail = list;
  out.n_tail = n;
  if (scored != nullptr) {
    out.scores = scored;
    out.s0 = t0;
    out.s1 = t0 + n_scored;
    out.s_stride = c.n_select;
  }
}

int64_t n_chunks(int64_t n_vis) {
  return (n_vis + kAttnChunk - 1) / kAttnChunk;
}

// Batches up to this many queries split their keys over tasks; larger ones have queries enough.
constexpr int32_t kSplitMaxQueries = 32;

// The rows' strides: the arguments' when struct_size covers them and any is set, else rows back
// to back by position. Set strides must each hold a row and keep every row apart (the positions'
// rows of one head inside the distance to the next head's, or the heads' rows inside a position's).
void set_strides(const specinfer_attention_args &a, Call &c) {
  c.k_pos = c.k_head_bytes * size_t(c.hkv);
  c.k_head = c.k_head_bytes;
  c.v_pos = c.v_head_bytes * size_t(c.hkv);
  c.v_head = c.v_head_bytes;
  if (a.struct_size < offsetof(specinfer_attention_args, v_head_stride) + sizeof a.v_head_stride ||
      (a.k_pos_stride == 0 && a.k_head_stride == 0 && a.v_pos_stride == 0 && a.v_head_stride == 0))
    return;
  const auto check = [&](const char *what, int64_t pos, int64_t head, size_t row) {
    const auto r = int64_t(row), n_kv = int64_t(a.n_kv), hkv = int64_t(c.hkv);
    const bool fits = pos >= r && head >= r && pos <= (int64_t{1} << 40) &&
                      head <= (int64_t{1} << 40) &&
                      (hkv == 1 || head >= n_kv * pos || pos >= hkv * head);
    if (!fits)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "attention: %s strides (position %lld, head %lld bytes) overlap rows of %zu bytes for "
           "%d positions and %d kv heads",
           what, (long long)pos, (long long)head, row, a.n_kv, a.n_head_kv);
  };
  check("k", a.k_pos_stride, a.k_head_stride, c.k_head_bytes);
  check("v", a.v_pos_stride, a.v_head_stride, c.v_head_bytes);
  c.k_pos = size_t(a.k_pos_stride);
  c.k_head = size_t(a.k_head_stride);
  c.v_pos = size_t(a.v_pos_stride);
  c.v_head = size_t(a.v_head_stride);
}

}  // namespace

const AttnKernels &attn_kernels_scalar() noexcept {
  static const AttnKernels k = {scores_s, accumulate_s, scores_tile_s};
  return k;
}

void quantize_query_q8(const float *x, int64_t hd, int8_t *qs, float *d, int32_t *bias) noexcept {
  for (int64_t b = 0; b < hd / kQK; ++b) {
    const float *xb = x + b * kQK;
    float amax = 0.0f;
    for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < kQK; ++i) {
      const float y = xb[i] * id;  // NaN for a NaN or infinite block: its scores become NaN
      const auto v = y == y ? int32_t(std::nearbyint(std::clamp(y, -127.0f, 127.0f))) : 0;
      qs[b * kQK + i] = int8_t(v);
      sum += v;
    }
    d[b] = db;
    bias[b] = -128 * sum;
  }
}

const AttnKernels &attn_kernels(Isa isa) noexcept {
  switch (isa) {
    case Isa::avx512:
      return attn_kernels_avx512();
    case Isa::avx2:
      return attn_kernels_avx2();
    default:
      return attn_kernels_scalar();
  }
}

bool kv_type_supported(int32_t type) noexcept {
  return type == SPECINFER_WTYPE_F32 || type == SPECINFER_WTYPE_F16 ||
         type == SPECINFER_WTYPE_Q8_0 || type == SPECINFER_WTYPE_Q4_0;
}

void kv_store(int32_t type, const float *src, void *dst, int64_t n) {
  if (!kv_type_supported(type))
    fail(SPECINFER_ERR_UNSUPPORTED, "kv_store: type %d is not a KV cache type", type);
  if (src == nullptr || dst == nullptr || n <= 0 || n % wtype_block_size(type) != 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "kv_store: NULL, or %lld values not whole blocks",
         (long long)n);
  if (type == SPECINFER_WTYPE_F32) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
  } else if (type == SPECINFER_WTYPE_F16) {
    auto *h = static_cast<uint8_t *>(dst);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t v = fp32_to_fp16(src[i]);
      std::memcpy(h + 2 * i, &v, 2);
    }
  } else {
    quantize_row_ref(type, src, dst, n);
  }
}

namespace {

// Throws unless the arguments' sizes, pointers and scale make a call.
void check_args(const specinfer_attention_args &a) {
  if (a.struct_size < offsetof(specinfer_attention_args, k_type))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: struct_size %u too small", a.struct_size);
  if (a.n_q <= 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.head_dim <= 0 || a.n_kv <= 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: sizes must be positive");
  if (a.n_head % a.n_head_kv != 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: %d heads not a multiple of %d kv heads",
         a.n_head, a.n_head_kv);
  if (a.mask == nullptr && a.n_kv < a.n_q)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: causal mask needs n_kv (%d) >= n_q (%d)",
         a.n_kv, a.n_q);
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.out == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: NULL q, k, v or out");
  if (!std::isfinite(a.scale)) fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: scale not finite");
}

// The call's types, kernels, shapes and cache layout (strides, key tiles).
void set_layout(const specinfer_attention_args &a, Isa isa, Call &c) {
  const bool typed = a.struct_size >= offsetof(specinfer_attention_args, v_type) + sizeof a.v_type;
  c.a = &a;
  c.k_type = typed ? a.k_type : SPECINFER_WTYPE_F32;
  c.v_type = typed ? a.v_type : SPECINFER_WTYPE_F32;
  for (const int32_t t : {c.k_type, c.v_type}) {
    if (!kv_type_supported(t))
      fail(SPECINFER_ERR_UNSUPPORTED,
           "attention: KV type %d (%s) not supported (f32, f16, q8_0, "
           "q4_0)",
           t, wtype_name(t));
    if (a.head_dim % wtype_block_size(t) != 0)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: head_dim %d is not a multiple of %s's %lld",
           a.head_dim, wtype_name(t), (long long)wtype_block_size(t));
  }
  c.vec = &vec_ops(isa);
  c.kern = a.head_dim % 32 == 0 ? &attn_kernels(isa) : &attn_kernels_scalar();
  c.hd = a.head_dim;
  c.g = a.n_head / a.n_head_kv;
  c.hkv = a.n_head_kv;
  c.k_head_bytes = wtype_row_size(c.k_type, c.hd);
  c.v_head_bytes = wtype_row_size(c.v_type, c.hd);
  c.k = reinterpret_cast<const uint8_t *>(a.k);
  c.v = reinterpret_cast<const uint8_t *>(a.v);
  set_strides(a, c);
  if (a.struct_size >= offsetof(specinfer_attention_args, k_tile) + sizeof a.k_tile &&
      a.k_tile != 0) {
    // Each kv head's tiles, the whole tile of the last key included, before the next head's.
    const int64_t tiled_kv =
        (int64_t(a.n_kv) + SPECINFER_KEY_TILE - 1) / SPECINFER_KEY_TILE * SPECINFER_KEY_TILE;
    if (a.k_tile != SPECINFER_KEY_TILE || c.k_type != SPECINFER_WTYPE_Q8_0 || c.hd % 32 != 0 ||
        c.k_pos != c.k_head_bytes || (c.hkv > 1 && c.k_head < size_t(tiled_kv) * c.k_head_bytes))
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "attention: k_tile %d needs %d, Q8_0 keys (k_type %d), head_dim a multiple of 32 (%d) "
           "and each kv head's positions one row apart (k_pos_stride %zu, a row %zu bytes), "
           "whole tiles of %lld positions per head",
           a.k_tile, SPECINFER_KEY_TILE, c.k_type, a.head_dim, c.k_pos, c.k_head_bytes,
           (long long)tiled_kv);
    c.k_tiled = true;
  }
}

// Sketched attention's parameters, when the arguments carry key sketches.
void set_sketching(const specinfer_attention_args &a, Call &c) {
  if (a.struct_size < offsetof(specinfer_attention_args, n_sink) + sizeof a.n_sink ||
      a.k_sketch == nullptr)
    return;
  if (!sketch_bits_valid(a.sketch_bits))
    fail(SPECINFER_ERR_INVALID_ARGUMENT,
         "attention: sketch_bits %d (expected a multiple of 32 in 32..1024)", a.sketch_bits);
  if (a.n_select < 1 || a.n_window < 0 || a.n_sink < 0 ||
      int64_t(a.n_select) + a.n_window + a.n_sink > (int64_t{1} << 30))
    fail(SPECINFER_ERR_INVALID_ARGUMENT,
         "attention: sketched attention needs n_select >= 1, n_window >= 0, n_sink >= 0 "
         "(got %d, %d, %d)",
         a.n_select, a.n_window, a.n_sink);
  if (int64_t(a.n_head_kv) * int64_t(key_sketch_bytes(a.sketch_bits)) * 16 > INT32_MAX)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: %d kv heads too many for sketches",
         a.n_head_kv);
  c.ks = a.k_sketch;
  c.ks_row = key_sketch_bytes(a.sketch_bits);
  c.bits = a.sketch_bits;
  c.n_select = a.n_select;
  c.n_window = a.n_window;
  c.n_sink = a.n_sink;
  if (a.struct_size >= offsetof(specinfer_attention_args, n_rescore) + sizeof a.n_rescore) {
    if (a.n_rescore < 0 || a.n_rescore > (1 << 30))
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "attention: n_rescore %d (expected 0 .. 2^30: candidates scored exactly)", a.n_rescore);
    c.n_rescore = a.n_rescore;
  }
}

// Each query's visible keys into c.views, the listed ones kept in *tails (which must outlive the
// call). Causal: the prefix up to the query. A mask: the first run of visible keys and then the
// rest listed, so that a tree node sees its cached prefix as one run and its ancestors listed: the
// same keys in the same order as plain decoding of its path, whose result it then equals bit for
// bit.
void build_views(const specinfer_attention_args &a, Call &c, std::vector<int32_t> *tails) {
  const int64_t n_q = a.n_q, n_kv = a.n_kv;
  c.views.resize(size_t(n_q));
  std::vector<int64_t> tail_at(size_t(n_q), 0);
  for (int64_t qi = 0; qi < n_q; ++qi) {
    View &vw = c.views[size_t(qi)];
    if (a.mask == nullptr) {
      vw.run = n_kv - n_q + qi + 1;
      continue;
    }
    const uint8_t *mq = a.mask + qi * n_kv;
    int64_t j = 0;
    while (j < n_kv && mq[j] == 0) ++j;
    vw.first = j;
    while (j < n_kv && mq[j] != 0) ++j;
    vw.run = j - vw.first;
    tail_at[size_t(qi)] = int64_t(tails->size());
    for (; j < n_kv; ++j)
      if (mq[j] != 0) tails->push_back(int32_t(j));
    vw.n_tail = int64_t(tails->size()) - tail_at[size_t(qi)];
  }
  for (int64_t qi = 0; qi < n_q; ++qi)
    if (c.views[size_t(qi)].n_tail > 0)
      c.views[size_t(qi)].tail = tails->data() + tail_at[size_t(qi)];
}

// The queries rounded for key tiles (c.q8, c.q8_d, c.q8_bias).
void quantize_queries(const specinfer_attention_args &a, Call &c) {
  const int64_t n_rows = int64_t(a.n_q) * a.n_head, nb = c.hd / 32;
  c.q8.resize(size_t(n_rows * c.hd));
  c.q8_d.resize(size_t(n_rows * nb));
  c.q8_bias.resize(size_t(n_rows * nb));
  tbb::parallel_for(int64_t(0), n_rows, [&](int64_t r) {
    quantize_query_q8(a.q + r * c.hd, c.hd, c.q8.data() + r * c.hd, c.q8_d.data() + r * nb,
                      c.q8_bias.data() + r * nb);
  });
}

// Sketched attention: the keys each (query, kv head) attends to.
void pick_all_keys(Call &c, Isa isa) {
  const int64_t n_q = c.a->n_q, hkv = c.hkv, items = n_q * hkv;
  const int64_t total = c.n_sink + c.n_select + c.n_window;
  c.item_views.resize(size_t(items));
  c.picked.resize(size_t(items * total));
  if (c.n_rescore > c.n_select && n_q <= kSplitMaxQueries)
    c.picked_scores.resize(size_t(items * c.g * c.n_select));
  const SketchScoreFn score = sketch_scorer(isa);
  tbb::parallel_for(int64_t(0), items,
                    [&](int64_t it) { pick_keys(c, it / hkv, it % hkv, score); });
}

// Task `it` over (tile of consecutive queries, kv head): its first query q0, its nq queries, and
// nc, the chunks of its query that sees the most keys.
struct Tile {
  int64_t q0, nq, nc;
};
Tile tile_of(const Call &c, int64_t it) {
  Tile t;
  t.q0 = it / c.hkv * kTileQueries;
  t.nq = std::min(kTileQueries, int64_t(c.a->n_q) - t.q0);
  t.nc = 0;
  for (int64_t i = 0; i < t.nq; ++i)
    t.nc = std::max(t.nc, n_chunks(view_of(c, t.q0 + i, it % c.hkv).size()));
  return t;
}

// Few queries: every chunk is a task of its own, its partial kept, then each query's partials
// merged in key order over its own chunks only.
void run_chunks_apart(const Call &c, int64_t tasks, size_t sf) {
  const int64_t hkv = c.hkv;
  std::vector<int64_t> first_task(size_t(tasks) + 1, 0);
  for (int64_t it = 0; it < tasks; ++it)
    first_task[size_t(it) + 1] = first_task[size_t(it)] + tile_of(c, it).nc;
  std::vector<float> part(size_t(first_task.back()) * sf);
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, tasks), [&](const tbb::blocked_range<int64_t> &r) {
        for (int64_t it = r.begin(); it < r.end(); ++it) {
          const Tile tl = tile_of(c, it);
          tbb::parallel_for(int64_t(0), tl.nc, [&](int64_t ch) {
            float *p = part.data() + size_t(first_task[size_t(it)] + ch) * sf;
            run_tile(c, tl.q0, tl.nq, it % hkv, ch * kAttnChunk, state_at(c, p, tl.nq));
          });
        }
      });
  tbb::parallel_for(int64_t(0), tasks, [&](int64_t it) {
    const Tile tl = tile_of(c, it);
    const int64_t kvh = it % hkv;
    auto chunk = [&](int64_t ch) {
      return state_at(c, part.data() + size_t(first_task[size_t(it)] + ch) * sf, tl.nq);
    };
    for (int64_t t = 0; t < tl.nq; ++t) {
      const int64_t nc_t = n_chunks(view_of(c, tl.q0 + t, kvh).size());
      if (nc_t == 0) {
        finish(c, tl.q0 + t, kvh, State{});
        continue;
      }
      const State acc = rows_of(c, chunk(0), t);
      for (int64_t ch = 1; ch < nc_t; ++ch) merge(c, acc, rows_of(c, chunk(ch), t));
      finish(c, tl.q0 + t, kvh, acc);
    }
  });
}

// Queries enough to keep every thread busy: a task per (tile, kv head), its chunks in turn,
// merged in key order as they come.
void run_chunks_in_turn(const Call &c, int64_t tasks, size_t sf) {
  const int64_t hkv = c.hkv;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, tasks), [&](const tbb::blocked_range<int64_t> &r) {
        std::vector<float> buf(2 * sf);
        for (int64_t it = r.begin(); it < r.end(); ++it) {
          const Tile tl = tile_of(c, it);
          const int64_t q0 = tl.q0, nq = tl.nq, kvh = it % hkv;
          const State acc = state_at(c, buf.data(), nq), cur = state_at(c, buf.data() + sf, nq);
          for (int64_t ch = 0; ch < tl.nc; ++ch) {
            run_tile(c, q0, nq, kvh, ch * kAttnChunk, ch == 0 ? acc : cur);
            if (ch == 0) continue;
            for (int64_t t = 0; t < nq; ++t)
              if (ch < n_chunks(view_of(c, q0 + t, kvh).size()))
                merge(c, rows_of(c, acc, t), rows_of(c, cur, t));
          }
          for (int64_t t = 0; t < nq; ++t)
            finish(c, q0 + t, kvh,
                   n_chunks(view_of(c, q0 + t, kvh).size()) == 0 ? State{} : rows_of(c, acc, t));
        }
      });
}

}  // namespace

void attention(const specinfer_attention_args &a) {
  check_args(a);
  const Isa isa = active_isa();
  Call c;
  set_layout(a, isa, c);
  set_sketching(a, c);
  std::vector<int32_t> tails;
  build_views(a, c, &tails);
  if (c.k_tiled) quantize_queries(a, c);
  if (c.ks) pick_all_keys(c, isa);
  // Tasks over (tile of consecutive queries, kv head); a tile's chunks are those of its query that
  // sees the most keys, and a query's partials merge in key order over its own chunks only.
  const int64_t n_q = a.n_q;
  const int64_t n_tiles = (n_q + kTileQueries - 1) / kTileQueries, tasks = n_tiles * c.hkv;
  const size_t sf = state_floats(c, std::min(n_q, kTileQueries));
  if (n_q <= kSplitMaxQueries)
    run_chunks_apart(c, tasks, sf);
  else
    run_chunks_in_turn(c, tasks, sf);
}

}  // namespace specinfer
