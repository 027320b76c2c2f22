// A tiny random transformer (Qwen2 or Llama shaped) written as GGUF for tests, together with a
// naive double-precision reference forward pass over the same (dequantized) weights.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/quant.h"
#include "data/gguf/gguf_writer.h"

namespace gguf_test {

struct TinyConfig {
  // "qwen2" (NeoX rope, QKV bias), "llama" (normal rope, no bias), "qwen3" (NeoX, q/k norms) or
  // "gemma3" (NeoX, q/k norms, scaled embeddings, GELU, post norms, sliding window `swa` in all
  // layers but every sixth, whose rope base is 10000 instead of rope_base).
  std::string arch = "qwen2";
  int swa = 0;
  int n_vocab = 80, n_embd = 64, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 96;
  int n_ctx = 256;
  float eps = 1e-6f, rope_base = 10000.0f;
  uint32_t wtype = 0;  // 0 = F32, 1 = F16, 8 = Q8_0 for the 2-D weight matrices
  bool tied = false;   // no output.weight: logits use token_embd.weight
  uint32_t seed = 1;
  // Scaled RoPE: rope.scaling.type ("" writes no scaling keys), .factor, .original_context_length
  // (0: not written), and per-pair factors written as rope_freqs.weight (empty: none).
  std::string rope_scaling;
  float rope_factor = 1.0f;
  int rope_orig_ctx = 0;
  std::vector<float> rope_freq_factors;
  int head_dim() const { return n_embd / n_head; }
};

// A tiny Gemma 3: sliding window of 4, six layers (five windowed with rope base 10000, one global
// with base 1e6).
inline TinyConfig tiny_gemma3() {
  TinyConfig g;
  g.arch = "gemma3";
  g.tied = true;
  g.n_layer = 6;
  g.n_head_kv = 1;
  g.swa = 4;
  g.rope_base = 1e6f;
  return g;
}

// Weights as floats (after the quantization round trip), row-major [rows][cols].
struct TinyWeights {
  struct Layer {
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv, wq, wk, wv, wo, gate, up, down;
    std::vector<float> q_norm, k_norm, post_attn_norm, post_ffn_norm;
  };
  std::vector<float> tok_embd, output, output_norm;
  std::vector<Layer> layers;
};

inline std::vector<uint8_t> encode_weights(uint32_t type, const std::vector<float> &v) {
  std::vector<uint8_t> out;
  if (type == 0) {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
  } else if (type == 1) {
    for (float f : v) {
      uint16_t h = specinfer::fp32_to_fp16(f);
      out.push_back(uint8_t(h & 0xff));
      out.push_back(uint8_t(h >> 8));
    }
  } else if (type == 8) {  // Q8_0: d = max|x| / 127, q = round(x / d)
    for (size_t b = 0; b < v.size(); b += 32) {
      float amax = 0;
      for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(v[b + i]));
      float d = amax / 127.0f;
      uint16_t dh = specinfer::fp32_to_fp16(d);
      float dq = specinfer::fp16_to_fp32(dh);
      out.push_back(uint8_t(dh & 0xff));
      out.push_back(uint8_t(dh >> 8));
      for (int i = 0; i < 32; i++) {
        int q = dq > 0 ? int(std::lround(v[b + i] / dq)) : 0;
        q = std::max(-127, std::min(127, q));
        out.push_back(uint8_t(int8_t(q)));
      }
    }
  }
  return out;
}

// Random weights with the quantization round trip applied, and the GGUF bytes that hold them.
inline std::vector<uint8_t> make_tiny_model(const TinyConfig &c, TinyWeights *w_out,
                                            Writer *writer_out = nullptr) {
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Writer w;
  w.kv_str("general.architecture", c.arch);
  w.kv_str("general.name", "tiny-" + c.arch);
  const std::string a = c.arch + ".";
  w.kv_u32(a + "context_length", uint32_t(c.n_ctx));
  w.kv_u32(a + "embedding_length", uint32_t(c.n_embd));
  w.kv_u32(a + "block_count", uint32_t(c.n_layer));
  w.kv_u32(a + "feed_forward_length", uint32_t(c.n_ff));
  w.kv_u32(a + "attention.head_count", uint32_t(c.n_head));
  w.kv_u32(a + "attention.head_count_kv", uint32_t(c.n_head_kv));
  w.kv_f32(a + "attention.layer_norm_rms_epsilon", c.eps);
  w.kv_f32(a + "rope.freq_base", c.rope_base);
  if (c.arch == "gemma3") w.kv_u32(a + "attention.sliding_window", uint32_t(c.swa));
  if (!c.rope_scaling.empty()) {
    w.kv_str(a + "rope.scaling.type", c.rope_scaling);
    w.kv_f32(a + "rope.scaling.factor", c.rope_factor);
  }
  if (c.rope_orig_ctx > 0)
    w.kv_u32(a + "rope.scaling.original_context_length", uint32_t(c.rope_orig_ctx));
  if (!c.rope_freq_factors.empty())
    w.tensor_f32("rope_freqs.weight", {uint64_t(c.rope_freq_factors.size())}, c.rope_freq_factors);
  // A minimal byte-level BPE vocabulary so that the plugin's tokenizer can load the file.
  std::vector<std::string> toks;
  std::vector<int32_t> types;
  for (int i = 0; i < c.n_vocab; i++) {
    toks.push_back(i < 2 ? (i == 0 ? "<|endoftext|>" : "<|im_end|>")
                         : std::string(1, char('!' + i)));
    types.push_back(i < 2 ? 3 : 1);
  }
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_str("tokenizer.ggml.pre", "qwen2");
  w.kv_str_array("tokenizer.ggml.tokens", toks);
  w.kv_array<int32_t>("tokenizer.ggml.token_type", T_I32, types);
  w.kv_str_array("tokenizer.ggml.merges", {std::string("# $")});
  w.kv_u32("tokenizer.ggml.eos_token_id", 0);
  w.kv_u32("tokenizer.ggml.bos_token_id", 0);
  w.kv_bool("tokenizer.ggml.add_bos_token", false);

  const int E = c.n_embd, hd = c.head_dim(), QD = c.n_head * hd, KV = c.n_head_kv * hd, F = c.n_ff;
  auto rnd = [&](size_t n, float scale) {
    std::vector<float> v(n);
    for (float &x : v) x = nd(rng) * scale;
    return v;
  };
  // A matrix stored as `type`, returned as the floats the file really holds.
  auto matrix = [&](const std::string &name, int rows, int cols, float scale, uint32_t type) {
    std::vector<float> v = rnd(size_t(rows) * size_t(cols), scale);
    std::vector<uint8_t> bytes = encode_weights(type, v);
    w.tensor(name, type, {uint64_t(cols), uint64_t(rows)}, bytes.data(), bytes.size());
    std::vector<float> back(v.size());
    specinfer::dequantize_row_ref(int32_t(type), bytes.data(), back.data(), int64_t(v.size()));
    return back;
  };
  auto vec = [&](const std::string &name, int n, float mean, float scale) {
    std::vector<float> v = rnd(size_t(n), scale);
    for (float &x : v) x += mean;
    w.tensor_f32(name, {uint64_t(n)}, v);
    return v;
  };
  TinyWeights tw;
  tw.tok_embd = matrix("token_embd.weight", c.n_vocab, E, 1.0f, c.wtype);
  tw.output_norm = vec("output_norm.weight", E, 1.0f, 0.1f);
  tw.output = c.tied ? tw.tok_embd : matrix("output.weight", c.n_vocab, E, 0.3f, c.wtype);
  const float ws = 1.0f / std::sqrt(float(E));
  for (int l = 0; l < c.n_layer; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    TinyWeights::Layer L;
    L.attn_norm = vec(p + "attn_norm.weight", E, 1.0f, 0.1f);
    L.wq = matrix(p + "attn_q.weight", QD, E, ws * 2, c.wtype);
    L.wk = matrix(p + "attn_k.weight", KV, E, ws * 2, c.wtype);
    L.wv = matrix(p + "attn_v.weight", KV, E, ws, c.wtype);
    if (c.arch == "qwen2") {
      L.bq = vec(p + "attn_q.bias", QD, 0.0f, 0.2f);
      L.bk = vec(p + "attn_k.bias", KV, 0.0f, 0.2f);
      L.bv = vec(p + "attn_v.bias", KV, 0.0f, 0.2f);
    }
    if (c.arch == "qwen3" || c.arch == "gemma3") {
      L.q_norm = vec(p + "attn_q_norm.weight", hd, 1.0f, 0.2f);
      L.k_norm = vec(p + "attn_k_norm.weight", hd, 1.0f, 0.2f);
    }
    L.wo = matrix(p + "attn_output.weight", E, QD, ws, c.wtype);
    if (c.arch == "gemma3") {
      L.post_attn_norm = vec(p + "post_attention_norm.weight", E, 0.5f, 0.1f);
      L.post_ffn_norm = vec(p + "post_ffw_norm.weight", E, 0.5f, 0.1f);
    }
    L.ffn_norm = vec(p + "ffn_norm.weight", E, 1.0f, 0.1f);
    L.gate = matrix(p + "ffn_gate.weight", F, E, ws, c.wtype);
    L.up = matrix(p + "ffn_up.weight", F, E, ws, c.wtype);
    L.down = matrix(p + "ffn_down.weight", E, F, 1.0f / std::sqrt(float(F)), c.wtype);
    tw.layers.push_back(std::move(L));
  }
  if (w_out) *w_out = std::move(tw);
  std::vector<uint8_t> bytes = w.build();
  if (writer_out) *writer_out = w;
  return bytes;
}

// The reference forward: every token of `tokens` (at `positions`) attends to the tokens j with
// visible(i, j) (a [n][n] 0/1 matrix), computed from scratch in double precision. Returns logits
// [n][n_vocab] and the final normed hidden states [n][n_embd].
inline void reference_forward(const TinyConfig &c, const TinyWeights &w,
                              const std::vector<int32_t> &tokens,
                              const std::vector<int32_t> &positions,
                              const std::vector<uint8_t> &visible, std::vector<double> *logits,
                              std::vector<double> *hidden) {
  const int n = int(tokens.size()), E = c.n_embd, hd = c.head_dim(), H = c.n_head,
            Hkv = c.n_head_kv;
  const int QD = H * hd, KV = Hkv * hd, F = c.n_ff;
  auto matvec = [](const std::vector<float> &W, int rows, int cols, const std::vector<double> &x) {
    std::vector<double> y(size_t(rows), 0.0);
    for (int r = 0; r < rows; r++) {
      double s = 0;
      for (int k = 0; k < cols; k++)
        s += double(W[size_t(r) * size_t(cols) + size_t(k)]) * x[size_t(k)];
      y[size_t(r)] = s;
    }
    return y;
  };
  auto rmsnorm = [&](const std::vector<double> &x, const std::vector<float> &g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    double s = 1.0 / std::sqrt(ss / double(x.size()) + double(c.eps));
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = x[i] * s * double(g[i]);
    return y;
  };
  const bool neox = c.arch != "llama", gemma = c.arch == "gemma3";
  // Scaled RoPE in the form of the papers (not the plugin's per-pair frequency table): linear
  // divides the position by the factor; YaRN (Peng et al. 2023) mixes the interpolated and the
  // original angle of each pair by a ramp over the pairs that turn between beta_slow = 1 and
  // beta_fast = 32 times in the original context, and scales cos and sin by 0.1 ln(s) + 1; per-pair
  // factors divide each pair's frequency.
  auto rope = [&](std::vector<double> &v, int n_heads, int pos, double base, bool scaled) {
    const std::string type = scaled ? c.rope_scaling : "";
    const double s = type.empty() ? 1.0 : double(c.rope_factor);
    const double orig = c.rope_orig_ctx > 0 ? c.rope_orig_ctx : c.n_ctx;
    auto pair_at = [&](double turns) {  // the (fractional) pair index turning `turns` times
      return hd * std::log(orig / (turns * 2 * M_PI)) / (2 * std::log(base));
    };
    const double lo = std::max(0.0, std::floor(pair_at(32))),
                 hi = std::min(hd - 1.0, std::ceil(pair_at(1)));
    for (int h = 0; h < n_heads; h++) {
      double *x = v.data() + size_t(h) * size_t(hd);
      for (int i = 0; i < hd / 2; i++) {
        double freq = std::pow(base, -2.0 * i / double(hd));
        if (scaled && !c.rope_freq_factors.empty()) freq /= double(c.rope_freq_factors[size_t(i)]);
        double theta = double(pos) * freq, mag = 1.0;
        if (type == "linear") theta = double(pos) / s * freq;
        if (type == "yarn") {
          const double keep = 1.0 - std::clamp((i - lo) / std::max(hi - lo, 0.001), 0.0, 1.0);
          theta = double(pos) * freq / s * (1.0 - keep) + double(pos) * freq * keep;
          mag = 0.1 * std::log(s) + 1.0;
        }
        double cs = std::cos(theta) * mag, sn = std::sin(theta) * mag;
        int i0 = neox ? i : 2 * i, i1 = neox ? i + hd / 2 : 2 * i + 1;
        double x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * cs - x1 * sn;
        x[i1] = x0 * sn + x1 * cs;
      }
    }
  };
  std::vector<std::vector<double>> x(static_cast<size_t>(n));
  for (int i = 0; i < n; i++)
    x[size_t(i)].assign(w.tok_embd.begin() + size_t(tokens[size_t(i)]) * size_t(E),
                        w.tok_embd.begin() + size_t(tokens[size_t(i)] + 1) * size_t(E));
  if (gemma)
    for (auto &xi : x)
      for (double &v : xi) v *= std::sqrt(double(E));
  auto head_norm = [&](std::vector<double> &v, int n_heads, const std::vector<float> &g) {
    for (int h = 0; h < n_heads; h++) {
      std::vector<double> part(v.begin() + h * hd, v.begin() + (h + 1) * hd);
      part = rmsnorm(part, g);
      std::copy(part.begin(), part.end(), v.begin() + h * hd);
    }
  };
  int layer_index = 0;
  for (const TinyWeights::Layer &L : w.layers) {
    const bool swa = gemma && c.swa > 0 && (layer_index + 1) % 6 != 0;
    const double base = swa ? 10000.0 : double(c.rope_base);
    layer_index++;
    auto sees = [&](int i, int j) {
      if (!visible[size_t(i) * size_t(n) + size_t(j)]) return false;
      return !swa || positions[size_t(i)] - positions[size_t(j)] < c.swa;
    };
    std::vector<std::vector<double>> q(static_cast<size_t>(n)), k(q), v(q);
    for (int i = 0; i < n; i++) {
      std::vector<double> h = rmsnorm(x[size_t(i)], L.attn_norm);
      q[size_t(i)] = matvec(L.wq, QD, E, h);
      k[size_t(i)] = matvec(L.wk, KV, E, h);
      v[size_t(i)] = matvec(L.wv, KV, E, h);
      if (!L.bq.empty()) {
        for (int j = 0; j < QD; j++) q[size_t(i)][size_t(j)] += L.bq[size_t(j)];
        for (int j = 0; j < KV; j++) k[size_t(i)][size_t(j)] += L.bk[size_t(j)];
        for (int j = 0; j < KV; j++) v[size_t(i)][size_t(j)] += L.bv[size_t(j)];
      }
      if (!L.q_norm.empty()) {
        head_norm(q[size_t(i)], H, L.q_norm);
        head_norm(k[size_t(i)], Hkv, L.k_norm);
      }
      rope(q[size_t(i)], H, positions[size_t(i)], base, !swa);
      rope(k[size_t(i)], Hkv, positions[size_t(i)], base, !swa);
    }
    std::vector<std::vector<double>> nx = x;
    for (int i = 0; i < n; i++) {
      std::vector<double> att(size_t(QD), 0.0);
      for (int h = 0; h < H; h++) {
        int g = h / (H / Hkv);
        std::vector<double> s(size_t(n), -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j < n; j++) {
          if (!sees(i, j)) continue;
          double d = 0;
          for (int t = 0; t < hd; t++)
            d += q[size_t(i)][size_t(h * hd + t)] * k[size_t(j)][size_t(g * hd + t)];
          s[size_t(j)] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (int j = 0; j < n; j++)
          if (sees(i, j)) z += std::exp(s[size_t(j)] - mx);
        for (int j = 0; j < n; j++) {
          if (!sees(i, j)) continue;
          double p = std::exp(s[size_t(j)] - mx) / z;
          for (int t = 0; t < hd; t++)
            att[size_t(h * hd + t)] += p * v[size_t(j)][size_t(g * hd + t)];
        }
      }
      std::vector<double> o = matvec(L.wo, E, QD, att);
      if (gemma) o = rmsnorm(o, L.post_attn_norm);
      for (int j = 0; j < E; j++) nx[size_t(i)][size_t(j)] += o[size_t(j)];
      std::vector<double> h2 = rmsnorm(nx[size_t(i)], L.ffn_norm);
      std::vector<double> gt = matvec(L.gate, F, E, h2), up = matvec(L.up, F, E, h2);
      for (int j = 0; j < F; j++) {
        double g = gt[size_t(j)];
        double act =
            gemma ? 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)))
                  : g / (1.0 + std::exp(-g));
        gt[size_t(j)] = act * up[size_t(j)];
      }
      std::vector<double> d = matvec(L.down, E, F, gt);
      if (gemma) d = rmsnorm(d, L.post_ffn_norm);
      for (int j = 0; j < E; j++) nx[size_t(i)][size_t(j)] += d[size_t(j)];
    }
    x = std::move(nx);
  }
  logits->assign(size_t(n) * size_t(c.n_vocab), 0.0);
  if (hidden) hidden->assign(size_t(n) * size_t(E), 0.0);
  for (int i = 0; i < n; i++) {
    std::vector<double> h = rmsnorm(x[size_t(i)], w.output_norm);
    if (hidden) std::copy(h.begin(), h.end(), hidden->begin() + size_t(i) * size_t(E));
    std::vector<double> lg = matvec(w.output, c.n_vocab, E, h);
    std::copy(lg.begin(), lg.end(), logits->begin() + size_t(i) * size_t(c.n_vocab));
  }
}

// Causal visibility for n tokens.
inline std::vector<uint8_t> causal_mask(int n) {
  std::vector<uint8_t> m(size_t(n) * size_t(n), 0);
  for (int i = 0; i < n; i++)
    for (int j = 0; j <= i; j++) m[size_t(i) * size_t(n) + size_t(j)] = 1;
  return m;
}

}  // namespace gguf_test
