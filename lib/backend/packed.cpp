// Packed weights: repacking, activation preparation, dispatch, and the scalar q4k_x8 kernel (the
// reference the AVX2 kernel must match bit for bit: same integer sums, same float steps).
#include "backend/packed.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <tuple>
#include <type_traits>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "../../common/fault_point.h"
#include "backend/matmul.h"
#include "util/error.h"

namespace specinfer {

void PackedWeight::Free::operator()(uint8_t *p) const noexcept {
  std::free(p);
}

PackLayout pack_layout(int32_t wtype, int64_t n_rows, int64_t n_cols, Isa isa) noexcept {
  if (wtype == SPECINFER_WTYPE_Q4_K)
    return isa == Isa::avx512 && n_rows % 16 == 0 ? PackLayout::q4k_r16 : PackLayout::q4k_x8;
  if (wtype == SPECINFER_WTYPE_Q4_0 && n_cols % 128 == 0) return PackLayout::q40_x4;
  if (wtype == SPECINFER_WTYPE_Q6_K)
    return isa == Isa::avx512 && n_rows % 16 == 0 ? PackLayout::q6k_r16 : PackLayout::q6k_x16;
  // Q4_0 with other column counts, Q5_0, Q8_0 and Q3_0. (For Q4_0 the sixteen-row kernel is also
  // faster than q40_x4 in cache, but the re-quantized 0.5B draft, memory-bound, drafts no faster
  // with it.) With AVX2 Q4_0, Q5_0 and Q3_0 only (see the layout).
  if ((wtype == SPECINFER_WTYPE_Q4_0 || wtype == SPECINFER_WTYPE_Q5_0 ||
       wtype == SPECINFER_WTYPE_Q8_0 || wtype == SPECINFER_WTYPE_Q3_0) &&
      n_rows % 16 == 0 &&
      (isa == Isa::avx512 || (isa == Isa::avx2 && wtype != SPECINFER_WTYPE_Q8_0)))
    return PackLayout::q32_r16;
  return PackLayout::plain;
}

namespace {

// Position of value i of group s in the q4k_x8 order: byte and nibble shift.
inline void x8_pos(int s, int i, int *byte, int *shift) {
  const int k = i / 4, j = i % 4;  // register k, byte 4s + j of it
  *byte = 32 * (k / 2) + 4 * s + j;
  *shift = 4 * (k % 2);
}

// Block i (block_bytes each) of row l of a sixteen-row group whose rows are row_bytes apart.
template <class Byte>
Byte *group_block(Byte *rows, size_t row_bytes, int l, int64_t i, size_t block_bytes) {
  return rows + static_cast<size_t>(l) * row_bytes + static_cast<size_t>(i) * block_bytes;
}

void check_sizes(int32_t wtype, const void *w, int64_t n_rows, int64_t n_cols) {
  const int64_t bs = wtype_block_size(wtype);
  if (bs == 0) fail(SPECINFER_ERR_UNSUPPORTED, "pack_weight: unknown weight type %d", wtype);
  if (w == nullptr) fail(SPECINFER_ERR_INVALID_ARGUMENT, "pack_weight: NULL weights");
  if (n_rows <= 0 || n_cols <= 0 || n_cols % bs != 0 || n_cols > (int64_t{1} << 30) ||
      n_rows >= (int64_t{1} << 31))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "pack_weight: bad shape %lld x %lld for %s",
         static_cast<long long>(n_rows), static_cast<long long>(n_cols), wtype_name(wtype));
}

// For each nibble of the packed order (byte b, low nibble at 2b, high at 2b + 1): where it comes
// from in the file order (byte index into qs, shift).
struct NibbleSource {
  uint8_t byte[256];
  uint8_t shift[256];
};

NibbleSource make_nibble_sources() {
  NibbleSource t{};
  for (int s = 0; s < 8; ++s)
    for (int i = 0; i < 32; ++i) {
      int byte, shift;
      x8_pos(s, i, &byte, &shift);
      const int n = 2 * byte + shift / 4;
      t.byte[n] = static_cast<uint8_t>(32 * (s / 2) + i);
      t.shift[n] = static_cast<uint8_t>(4 * (s & 1));
    }
  return t;
}

const NibbleSource &nibble_sources() {
  static const NibbleSource t = make_nibble_sources();
  return t;
}

// The file's 12 scale bytes (K-quant order, kquant_scale_min) from eight scales and mins.
void kquant_encode_scales(const uint8_t *sc, const uint8_t *mn, uint8_t *q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

// Sets value v (0..255, 0..63) of a Q6_K block in the file's order.
void q6k_file_set(uint8_t *blk, int v, int q) {
  const int n = v / 128, l = v % 32, quarter = (v % 128) / 32;
  uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
  uint8_t &b = ql[l + 32 * (quarter % 2)];
  const int nshift = quarter < 2 ? 0 : 4;
  b = static_cast<uint8_t>((b & ~(15 << nshift)) | ((q & 15) << nshift));
  qh[l] = static_cast<uint8_t>((qh[l] & ~(3 << (2 * quarter))) | (((q >> 4) & 3) << (2 * quarter)));
}

// Where value 2k + j of group g lives in the q6k_x16 order: the nibble (byte, shift) and the
// 2-bit pair (byte, shift).
void x16_pos(int g, int k, int j, int *nb, int *ns, int *hb, int *hs) {
  *nb = 32 * (k / 2) + 2 * g + j;
  *ns = 4 * (k % 2);
  *hb = 128 + 32 * (k / 4) + 2 * g + j;
  *hs = 2 * (k % 4);
}

int q6k_x16_get(const uint8_t *blk, int g, int k, int j) {
  int nb, ns, hb, hs;
  x16_pos(g, k, j, &nb, &ns, &hb, &hs);
  return ((blk[nb] >> ns) & 15) | (((blk[hb] >> hs) & 3) << 4);
}

// The 256 values (0..63) of a Q6_K block, in column order. The file's order: per half n, ql[l]
// and ql[l + 32] give values l, l + 32 in their low nibbles and l + 64, l + 96 in their high ones,
// qh[l] the high bit pairs of all four. (This runs for every Q6_K block at model load.)
void q6k_file_values(const uint8_t *src, uint8_t *q) noexcept {
  for (int n = 0; n < 2; ++n) {
    const uint8_t *ql = src + 64 * n, *qh = src + 128 + 32 * n;
    uint8_t *v = q + 128 * n;
    for (int l = 0; l < 32; ++l) {
      const int h = qh[l];
      v[l] = static_cast<uint8_t>((ql[l] & 15) | ((h & 3) << 4));
      v[l + 32] = static_cast<uint8_t>((ql[l + 32] & 15) | (((h >> 2) & 3) << 4));
      v[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((h >> 4) & 3) << 4));
      v[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4));
    }
  }
}

}  // namespace

void pack_block_q6k_x16(const uint8_t *src, uint8_t *dst) noexcept {
  uint8_t q[256];
  q6k_file_values(src, q);
  for (int g = 0; g < 16; ++g)
    for (int j = 0; j < 2; ++j) {
      const uint8_t *v = q + 16 * g + j;  // v[2k] = value 2k + j of group g
      for (int c = 0; c < 4; ++c)
        dst[32 * c + 2 * g + j] =
            static_cast<uint8_t>((v[4 * c] & 15) | ((v[4 * c + 2] & 15) << 4));
      for (int h = 0; h < 2; ++h)
        dst[128 + 32 * h + 2 * g + j] =
            static_cast<uint8_t>((v[8 * h] >> 4) | ((v[8 * h + 2] >> 4) << 2) |
                                 ((v[8 * h + 4] >> 4) << 4) | ((v[8 * h + 6] >> 4) << 6));
    }
  std::memcpy(dst + 192, src + 192, 18);  // scales, d
}

void unpack_block_q6k_x16(const uint8_t *src, uint8_t *dst) noexcept {
  std::memset(dst, 0, 192);
  for (int g = 0; g < 16; ++g)
    for (int k = 0; k < 8; ++k)
      for (int j = 0; j < 2; ++j) q6k_file_set(dst, 16 * g + 2 * k + j, q6k_x16_get(src, g, k, j));
  std::memcpy(dst + 192, src + 192, 18);
}

void act_to_q8k16(const ActQ8K *a, ActQ8K16 *out, int64_t n_blocks) noexcept {
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int k = 0; k < 8; ++k)
      for (int g = 0; g < 16; ++g)
        std::memcpy(out[b].qs + 32 * k + 2 * g, a[b].qs + 16 * g + 2 * k, 2);
    std::memcpy(out[b].bsums, a[b].bsums, sizeof out[b].bsums);
    out[b].d = a[b].d;
  }
}

void pack_block_q4k_x8(const uint8_t *src, uint8_t *dst) noexcept {
  const NibbleSource &t = nibble_sources();
  const uint8_t *qs = src + 16;
  uint8_t out[128];
  for (int b = 0; b < 128; ++b) {
    const int lo = (qs[t.byte[2 * b]] >> t.shift[2 * b]) & 15;
    const int hi = (qs[t.byte[2 * b + 1]] >> t.shift[2 * b + 1]) & 15;
    out[b] = static_cast<uint8_t>(lo | (hi << 4));
  }
  uint8_t e[12] = {};
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, mn;
    kquant_scale_min(s, src + 4, &sc, &mn);
    e[s] = static_cast<uint8_t>(sc | ((mn & 3) << 6));
    e[8 + s / 2] = static_cast<uint8_t>(e[8 + s / 2] | ((mn >> 2) << (4 * (s & 1))));
  }
  std::memcpy(dst, src, 4);  // d, dmin
  std::memcpy(dst + 4, e, 12);
  std::memcpy(dst + 16, out, 128);
}

void unpack_block_q4k_x8(const uint8_t *src, uint8_t *dst) noexcept {
  std::memcpy(dst, src, 4);
  uint8_t sc[8], mn[8];
  for (int s = 0; s < 8; ++s) x8_scale_min(s, src + 4, &sc[s], &mn[s]);
  kquant_encode_scales(sc, mn, dst + 4);
  uint8_t out[128] = {};
  for (int s = 0; s < 8; ++s)
    for (int i = 0; i < 32; ++i) {
      int byte, shift;
      x8_pos(s, i, &byte, &shift);
      const int v = (src[16 + byte] >> shift) & 15;
      out[32 * (s / 2) + i] = static_cast<uint8_t>(out[32 * (s / 2) + i] | (v << ((s & 1) * 4)));
    }
  std::memcpy(dst + 16, out, 128);
}

void pack_q40_x4(const uint8_t *src, uint8_t *dst) noexcept {
  uint8_t vals[4][32];
  for (int g = 0; g < 4; ++g) {
    const uint8_t *b = src + g * sizeof(BlockQ4_0);
    std::memcpy(dst + 2 * g, b, 2);  // d
    for (int j = 0; j < 16; ++j) {
      vals[g][j] = b[2 + j] & 15;
      vals[g][j + 16] = b[2 + j] >> 4;
    }
  }
  for (int c = 0; c < 2; ++c)
    for (int g = 0; g < 4; ++g)
      for (int i = 0; i < 8; ++i)
        dst[8 + 32 * c + 8 * g + i] =
            static_cast<uint8_t>(vals[g][16 * c + i] | (vals[g][16 * c + 8 + i] << 4));
}

void unpack_q40_x4(const uint8_t *src, uint8_t *dst) noexcept {
  uint8_t vals[4][32];
  for (int c = 0; c < 2; ++c)
    for (int g = 0; g < 4; ++g)
      for (int i = 0; i < 8; ++i) {
        const uint8_t b = src[8 + 32 * c + 8 * g + i];
        vals[g][16 * c + i] = b & 15;
        vals[g][16 * c + 8 + i] = b >> 4;
      }
  for (int g = 0; g < 4; ++g) {
    uint8_t *b = dst + g * sizeof(BlockQ4_0);
    std::memcpy(b, src + 2 * g, 2);
    for (int j = 0; j < 16; ++j)
      b[2 + j] = static_cast<uint8_t>(vals[g][j] | (vals[g][j + 16] << 4));
  }
}

void act_to_q8x4(const ActQ8 *a, ActQ8X4 *out, int64_t n_super) noexcept {
  for (int64_t b = 0; b < n_super; ++b) {
    ActQ8X4 &o = out[b];
    for (int g = 0; g < 4; ++g) {
      const ActQ8 &blk = a[4 * b + g];
      for (int k = 0; k < 4; ++k) std::memcpy(o.qs + 32 * k + 8 * g, blk.qs + 8 * k, 8);
      for (int h = 0; h < 2; ++h) {
        int32_t sum = 0;
        for (int k = 0; k < 4; ++k)
          for (int j = 0; j < 4; ++j) sum += blk.qs[8 * k + 4 * h + j];
        o.xd[2 * g + h] = blk.d;
        o.osum[2 * g + h] = 8 * sum;
      }
    }
  }
}

namespace {

// The sum of group s's 32 values (|sum| <= 32 * 127).
int group32_sum(const ActQ8K &a, int s) {
  return a.bsums[2 * s] + a.bsums[2 * s + 1];
}

// xs[s] = d x the sum of group s's 32 values (ActQ8KP).
void group32_sums(const ActQ8K &a, float *xs) {
  for (int s = 0; s < 8; ++s) xs[s] = a.d * static_cast<float>(group32_sum(a, s));
}

}  // namespace

void act_to_q8kp(const ActQ8K *a, ActQ8KP *out, int64_t n_blocks) noexcept {
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int k = 0; k < 8; ++k)
      for (int s = 0; s < 8; ++s)
        std::memcpy(out[b].qs + 32 * k + 4 * s, a[b].qs + 32 * s + 4 * k, 4);
    group32_sums(a[b], out[b].xs);
    out[b].d = a[b].d;
  }
}

namespace {

static_assert(kR16Tile == 16 * sizeof(BlockQ4_K), "a q4k_r16 tile holds sixteen super-blocks");

// Byte and nibble shift of value v (0..255) in a Q4_K block's 128 quant bytes (the file's order:
// group s = v / 32 in byte 32 (s / 2) + v % 32, low nibble for even s).
inline void q4k_file_pos(int v, int *byte, int *shift) {
  const int s = v / 32;
  *byte = 32 * (s / 2) + v % 32;
  *shift = 4 * (s & 1);
}

}  // namespace

void pack_tile_q4k_r16(const uint8_t *src, size_t src_row_bytes, int64_t i,
                       uint8_t *tile) noexcept {
  std::memset(tile, 0, kR16Tile);
  for (int l = 0; l < 16; ++l) {
    const uint8_t *blk = group_block(src, src_row_bytes, l, i, sizeof(BlockQ4_K));
    // Tile byte r16_nibble_byte(l, c) holds values c (low nibble) and c + 4 (high), c = 32 g + 8 a
    // + r (r < 4): both in group g, whose nibbles are in file bytes 32 (g / 2) + c % 32, each
    // byte written once.
    for (int g = 0; g < 8; ++g) {
      const uint8_t *qs = blk + 16 + 32 * (g / 2);
      const int sh = 4 * (g & 1);
      for (int a = 0; a < 4; ++a)
        for (int r = 0; r < 4; ++r)
          tile[r16_nibble_byte(l, 32 * g + 8 * a + r)] = static_cast<uint8_t>(
              ((qs[8 * a + r] >> sh) & 15) | (((qs[8 * a + 4 + r] >> sh) & 15) << 4));
    }
    for (int sg = 0; sg < 8; ++sg) {
      uint8_t sc, mn;
      kquant_scale_min(sg, blk + 4, &sc, &mn);
      tile[kR16Scales + 16 * sg + l] = static_cast<uint8_t>(sc | ((mn & 3) << 6));
      uint8_t &h = tile[kR16MinHigh + 16 * (sg / 2) + l];
      h = static_cast<uint8_t>(h | ((mn >> 2) << (4 * (sg & 1))));
    }
    std::memcpy(tile + kR16D + 2 * l, blk, 2);
    std::memcpy(tile + kR16Dmin + 2 * l, blk + 2, 2);
  }
}

void unpack_tile_q4k_r16(const uint8_t *tile, uint8_t *dst, size_t dst_row_bytes,
                         int64_t i) noexcept {
  for (int l = 0; l < 16; ++l) {
    uint8_t *blk = group_block(dst, dst_row_bytes, l, i, sizeof(BlockQ4_K));
    std::memcpy(blk, tile + kR16D + 2 * l, 2);
    std::memcpy(blk + 2, tile + kR16Dmin + 2 * l, 2);
    uint8_t sc[8], mn[8];
    for (int sg = 0; sg < 8; ++sg) r16_scale_min(tile, l, sg, &sc[sg], &mn[sg]);
    kquant_encode_scales(sc, mn, blk + 4);
    std::memset(blk + 16, 0, 128);
    for (int c = 0; c < 256; ++c) {
      const int q = (tile[r16_nibble_byte(l, c)] >> (4 * ((c / 4) % 2))) & 15;
      int byte, shift;
      q4k_file_pos(c, &byte, &shift);
      blk[16 + byte] = static_cast<uint8_t>(blk[16 + byte] | (q << shift));
    }
  }
}

void act_to_q8ks(const ActQ8K *a, ActQ8KS *out, int64_t n_blocks) noexcept {
  for (int64_t b = 0; b < n_blocks; ++b) {
    std::memcpy(out[b].qs, a[b].qs, 256);
    for (int s = 0; s < 8; ++s) out[b].bsums[s] = static_cast<int16_t>(group32_sum(a[b], s));
    out[b].d = a[b].d;
  }
}

static_assert(kQ6R16D + 32 <= kQ6R16Tile && kQ6R16Tile % 64 == 0 &&
                  kQ6R16Tile - 64 < 16 * sizeof(BlockQ6_K),
              "a q6k_r16 tile holds sixteen super-blocks, padded to a whole cache line");

int q6k_r16_value(const uint8_t *tile, int l, int c) noexcept {
  const int low = (tile[r16_nibble_byte(l, c)] >> (4 * ((c / 4) % 2))) & 15;
  const int high = (tile[kQ6R16High + q6r16_high_byte(l, c)] >> q6r16_high_shift(c)) & 3;
  return low | high << 4;
}

void pack_tile_q6k_r16(const uint8_t *src, size_t src_row_bytes, int64_t i,
                       uint8_t *tile) noexcept {
  std::memset(tile, 0, kQ6R16Tile);
  for (int l = 0; l < 16; ++l) {
    const uint8_t *blk = group_block(src, src_row_bytes, l, i, sizeof(BlockQ6_K));
    uint8_t q[256];
    q6k_file_values(blk, q);
    for (int c = 0; c < 256; ++c) {
      tile[r16_nibble_byte(l, c)] |= static_cast<uint8_t>((q[c] & 15) << (4 * ((c / 4) % 2)));
      tile[kQ6R16High + q6r16_high_byte(l, c)] |=
          static_cast<uint8_t>((q[c] >> 4) << q6r16_high_shift(c));
    }
    for (int g = 0; g < 16; ++g) tile[kQ6R16Scales + 16 * g + l] = blk[192 + g];
    std::memcpy(tile + kQ6R16D + 2 * l, blk + 208, 2);
  }
}

void unpack_tile_q6k_r16(const uint8_t *tile, uint8_t *dst, size_t dst_row_bytes,
                         int64_t i) noexcept {
  for (int l = 0; l < 16; ++l) {
    uint8_t *blk = group_block(dst, dst_row_bytes, l, i, sizeof(BlockQ6_K));
    std::memset(blk, 0, 192);
    for (int c = 0; c < 256; ++c) q6k_file_set(blk, c, q6k_r16_value(tile, l, c));
    for (int g = 0; g < 16; ++g) blk[192 + g] = tile[kQ6R16Scales + 16 * g + l];
    std::memcpy(blk + 208, tile + kQ6R16D + 2 * l, 2);
  }
}

namespace {

// Value j (0..31) of a file block of wtype, unsigned as q32_r16 stores it.
int block32_value(int32_t wtype, const uint8_t *blk, int j) {
  if (wtype == SPECINFER_WTYPE_Q8_0) return static_cast<int8_t>(blk[2 + j]) + 128;
  if (wtype == SPECINFER_WTYPE_Q3_0)
    return q3_0_value(*reinterpret_cast<const BlockQ3_0 *>(blk), j);
  const uint8_t *qs = blk + (wtype == SPECINFER_WTYPE_Q5_0 ? 6 : 2);
  int q = (qs[j % 16] >> (4 * (j / 16))) & 15;
  if (wtype == SPECINFER_WTYPE_Q5_0) {
    uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    q |= static_cast<int>((qh >> j) & 1) << 4;
  }
  return q;
}

// Where row l's value at column c lies in a q32_r16 tile: for the nibble types its byte and
// shift, for Q8_0 its byte, for Q3_0 the byte and shift of its low two bits. Q5_0's fifth bit
// is bit c / 4 of byte 256 + 4 l + c % 4, Q3_0's third bit the same bit of byte 128 + 4 l + c % 4.
inline int r16_32_nibble_byte(int l, int c) {
  return 64 * (c / 8) + 4 * l + c % 4;
}
inline int r16_32_nibble_shift(int c) {
  return 4 * ((c / 4) % 2);
}
inline int r16_32_lane_byte(int l, int c) {
  return 64 * (c / 4) + 4 * l + c % 4;
}
inline int r16_32_pair_byte(int l, int c) {
  return 64 * (c / 16) + 4 * l + c % 4;
}
inline int r16_32_pair_shift(int c) {
  return 2 * ((c / 4) % 4);
}

// The scalar kernels of the sixteen-row layouts: row r is lane r % 16 of row group r / 16, whose
// tiles (tile_bytes each) follow one another; y[t][r] = the float block(tile, lane, x block, acc)
// leaves after the row's blocks in order, from 0.
template <class Args, class Block>
void r16_rows_scalar(const Args &a, size_t tile_bytes, int64_t r0, int64_t r1, Block &&block) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t g = r / 16;
    const int l = static_cast<int>(r % 16);
    for (int64_t t = 0; t < a.n_tok; ++t) {
      float acc = 0.0f;
      for (int64_t i = 0; i < a.n_blocks; ++i)
        acc = block(a.w + static_cast<size_t>(g * a.n_blocks + i) * tile_bytes, l,
                    a.x[t * a.n_blocks + i], acc);
      a.y[t * a.y_stride + r] = acc;
    }
  }
}

}  // namespace

int q32_r16_value(int32_t wtype, const uint8_t *tile, int l, int c) noexcept {
  if (wtype == SPECINFER_WTYPE_Q8_0) return tile[r16_32_lane_byte(l, c)];
  if (wtype == SPECINFER_WTYPE_Q3_0)
    return ((tile[r16_32_pair_byte(l, c)] >> r16_32_pair_shift(c)) & 3) |
           ((tile[128 + 4 * l + c % 4] >> (c / 4)) & 1) << 2;
  int q = (tile[r16_32_nibble_byte(l, c)] >> r16_32_nibble_shift(c)) & 15;
  if (wtype == SPECINFER_WTYPE_Q5_0) q |= ((tile[256 + 4 * l + c % 4] >> (c / 4)) & 1) << 4;
  return q;
}

namespace {
// pack_tile_q32_r16 for one type, known when compiled: its branches on the type fold away (the
// packing of a model's weights at load runs several times faster than with them).
template <int32_t wtype>
void pack_tile_q32_r16_of(const uint8_t *src, size_t src_row_bytes, int64_t i,
                          uint8_t *tile) noexcept {
  const size_t bb = wtype_row_size(wtype, 32);
  std::memset(tile, 0, q32_r16_tile_bytes(wtype));
  for (int l = 0; l < 16; ++l) {
    const uint8_t *blk = group_block(src, src_row_bytes, l, i, bb);
    for (int c = 0; c < 32; ++c) {
      const int q = block32_value(wtype, blk, c);
      if (wtype == SPECINFER_WTYPE_Q8_0) {
        tile[r16_32_lane_byte(l, c)] = static_cast<uint8_t>(q);
        continue;
      }
      if (wtype == SPECINFER_WTYPE_Q3_0) {
        uint8_t &t = tile[r16_32_pair_byte(l, c)], &h = tile[128 + 4 * l + c % 4];
        t = static_cast<uint8_t>(t | ((q & 3) << r16_32_pair_shift(c)));
        h = static_cast<uint8_t>(h | ((q >> 2) & 1) << (c / 4));
        continue;
      }
      uint8_t &t = tile[r16_32_nibble_byte(l, c)];
      t = static_cast<uint8_t>(t | ((q & 15) << r16_32_nibble_shift(c)));
      if (wtype == SPECINFER_WTYPE_Q5_0 && (q & 16) != 0) {
        uint8_t &h = tile[256 + 4 * l + c % 4];
        h = static_cast<uint8_t>(h | (1 << (c / 4)));
      }
    }
    std::memcpy(tile + q32_r16_d_offset(wtype) + 2 * l, blk, 2);
  }
}
}  // namespace

void pack_tile_q32_r16(int32_t wtype, const uint8_t *src, size_t src_row_bytes, int64_t i,
                       uint8_t *tile) noexcept {
  switch (wtype) {
    case SPECINFER_WTYPE_Q4_0:
      return pack_tile_q32_r16_of<SPECINFER_WTYPE_Q4_0>(src, src_row_bytes, i, tile);
    case SPECINFER_WTYPE_Q5_0:
      return pack_tile_q32_r16_of<SPECINFER_WTYPE_Q5_0>(src, src_row_bytes, i, tile);
    case SPECINFER_WTYPE_Q3_0:
      return pack_tile_q32_r16_of<SPECINFER_WTYPE_Q3_0>(src, src_row_bytes, i, tile);
    default:  // Q8_0, the layout's one other type
      return pack_tile_q32_r16_of<SPECINFER_WTYPE_Q8_0>(src, src_row_bytes, i, tile);
  }
}

void unpack_tile_q32_r16(int32_t wtype, const uint8_t *tile, uint8_t *dst, size_t dst_row_bytes,
                         int64_t i) noexcept {
  const size_t bb = wtype_row_size(wtype, 32);
  for (int l = 0; l < 16; ++l) {
    uint8_t *blk = group_block(dst, dst_row_bytes, l, i, bb);
    std::memset(blk, 0, bb);
    std::memcpy(blk, tile + q32_r16_d_offset(wtype) + 2 * l, 2);
    uint32_t qh = 0;
    for (int c = 0; c < 32; ++c) {
      const int q = q32_r16_value(wtype, tile, l, c);
      if (wtype == SPECINFER_WTYPE_Q8_0) {
        blk[2 + c] = static_cast<uint8_t>(q - 128);
        continue;
      }
      if (wtype == SPECINFER_WTYPE_Q3_0) {
        q3_0_set(*reinterpret_cast<BlockQ3_0 *>(blk), c, q);
        continue;
      }
      uint8_t *qs = blk + (wtype == SPECINFER_WTYPE_Q5_0 ? 6 : 2);
      qs[c % 16] = static_cast<uint8_t>(qs[c % 16] | ((q & 15) << (4 * (c / 16))));
      qh |= static_cast<uint32_t>((q >> 4) & 1) << c;
    }
    if (wtype == SPECINFER_WTYPE_Q5_0) std::memcpy(blk + 2, &qh, 4);
  }
}

void q32_r16_rows_scalar(const PackedArgsQ32 &a, int64_t r0, int64_t r1) noexcept {
  const int off = q32_r16_offset(a.wtype);
  r16_rows_scalar(a, q32_r16_tile_bytes(a.wtype), r0, r1,
                  [&](const uint8_t *tile, int l, const ActQ8 &x, float acc) {
                    uint16_t dh;
                    std::memcpy(&dh, tile + q32_r16_d_offset(a.wtype) + 2 * l, 2);
                    int32_t sum = -off * x.sum;
                    for (int c = 0; c < 32; ++c)
                      sum += q32_r16_value(a.wtype, tile, l, c) * x.qs[c];
                    // As the AVX-512 kernel: sum * (d * xd) added.
                    return std::fma(static_cast<float>(sum), fp16_to_fp32(dh) * x.d, acc);
                  });
}

std::unique_ptr<PackedWeight> pack_weight(int32_t wtype, const void *w, int64_t n_rows,
                                          int64_t n_cols) {
  return pack_weight_for(active_isa(), wtype, w, n_rows, n_cols);
}

std::unique_ptr<PackedWeight> pack_weight_for(Isa isa, int32_t wtype, const void *w, int64_t n_rows,
                                              int64_t n_cols) {
  check_sizes(wtype, w, n_rows, n_cols);
  auto pw = std::make_unique<PackedWeight>();
  pw->wtype = wtype;
  pw->layout = pack_layout(wtype, n_rows, n_cols, isa);
  pw->rows = n_rows;
  pw->cols = n_cols;
  pw->row_bytes = wtype_row_size(wtype, n_cols);
  if (pw->layout == PackLayout::plain) {
    pw->data = static_cast<const uint8_t *>(w);
    return pw;
  }
  // q6k_r16 tiles are padded (see the layout); every other layout keeps the file's size.
  const size_t bytes = pw->layout == PackLayout::q6k_r16
                           ? static_cast<size_t>(n_rows / 16 * (n_cols / kQKK)) * kQ6R16Tile
                           : pw->row_bytes * static_cast<size_t>(n_rows);
  auto *mem = fault_injected(FAULT_ALLOC)
                  ? nullptr
                  : static_cast<uint8_t *>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  if (mem == nullptr)
    fail(SPECINFER_ERR_OUT_OF_MEMORY, "pack_weight: cannot allocate %zu bytes", bytes);
  pw->owned.reset(mem);
  pw->data = mem;
  pw->packed_bytes = bytes;
  const auto *src = static_cast<const uint8_t *>(w);
  if (pw->layout == PackLayout::q32_r16) {
    const int64_t nb = n_cols / 32, n_tiles = n_rows / 16 * nb;
    const size_t tb = q32_r16_tile_bytes(wtype);
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, n_tiles, 256), [&](const tbb::blocked_range<int64_t> &r) {
          for (int64_t k = r.begin(); k < r.end(); ++k)
            pack_tile_q32_r16(wtype, src + static_cast<size_t>(k / nb) * 16 * pw->row_bytes,
                              pw->row_bytes, k % nb, mem + static_cast<size_t>(k) * tb);
        });
    return pw;
  }
  if (pw->layout == PackLayout::q4k_r16 || pw->layout == PackLayout::q6k_r16) {
    const bool q6 = pw->layout == PackLayout::q6k_r16;
    const size_t tb = q6 ? kQ6R16Tile : kR16Tile;
    const auto pack_tile = q6 ? pack_tile_q6k_r16 : pack_tile_q4k_r16;
    const int64_t nb = n_cols / kQKK, n_tiles = n_rows / 16 * nb;
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_tiles, 64),
                      [&](const tbb::blocked_range<int64_t> &r) {
                        for (int64_t k = r.begin(); k < r.end(); ++k)
                          pack_tile(src + static_cast<size_t>(k / nb) * 16 * pw->row_bytes,
                                    pw->row_bytes, k % nb, mem + static_cast<size_t>(k) * tb);
                      });
    return pw;
  }
  // Every layout keeps the size: q4k_x8 one 144-byte super-block for one, q6k_x16 210 bytes for
  // 210, q40_x4 72 bytes for four 18-byte blocks (which never straddle rows: n_cols is a multiple
  // of 128).
  size_t unit = 4 * sizeof(BlockQ4_0);
  void (*pack_unit)(const uint8_t *, uint8_t *) noexcept = pack_q40_x4;
  if (pw->layout == PackLayout::q4k_x8) {
    unit = sizeof(BlockQ4_K);
    pack_unit = pack_block_q4k_x8;
  } else if (pw->layout == PackLayout::q6k_x16) {
    unit = sizeof(BlockQ6_K);
    pack_unit = pack_block_q6k_x16;
  }
  const auto n_units = static_cast<int64_t>(bytes / unit);
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, n_units, 4096), [&](const tbb::blocked_range<int64_t> &r) {
        for (int64_t b = r.begin(); b < r.end(); ++b)
          pack_unit(src + static_cast<size_t>(b) * unit, mem + static_cast<size_t>(b) * unit);
      });
  return pw;
}

void q4k_x8_rows_scalar(const PackedArgs &a, int64_t r0, int64_t r1) noexcept {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int64_t t = 0; t < a.n_tok; ++t) {
      const ActQ8KP *x = a.x + t * a.n_blocks;
      float acc[8] = {};
      for (int64_t i = 0; i < a.n_blocks; ++i) {
        const uint8_t *blk = row + static_cast<size_t>(i) * sizeof(BlockQ4_K);
        uint16_t dh, dmh;
        std::memcpy(&dh, blk, 2);
        std::memcpy(&dmh, blk + 2, 2);
        const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(dmh);
        const float dx = d * x[i].d;
        for (int s = 0; s < 8; ++s) {
          uint8_t sc, mn;
          x8_scale_min(s, blk + 4, &sc, &mn);
          int32_t sum = 0;
          for (int k = 0; k < 8; ++k)
            for (int j = 0; j < 4; ++j) {
              const int byte = 32 * (k / 2) + 4 * s + j;
              const int q = (blk[16 + byte] >> (4 * (k % 2))) & 15;
              sum += q * x[i].qs[32 * k + 4 * s + j];
            }
          const float mv = dmin * static_cast<float>(mn);
          // As the AVX2 kernel: fma(int sum * scale, d * xd, fma(-mv, xs, acc)).
          acc[s] = std::fma(static_cast<float>(sum * sc), dx, std::fma(-mv, x[i].xs[s], acc[s]));
        }
      }
      // The AVX2 horizontal sum's order.
      const float h0 = acc[0] + acc[4], h1 = acc[1] + acc[5], h2 = acc[2] + acc[6],
                  h3 = acc[3] + acc[7];
      a.y[t * a.y_stride + r] = (h0 + h2) + (h1 + h3);
    }
  }
}

void q4k_r16_rows_scalar(const PackedArgsR16 &a, int64_t r0, int64_t r1) noexcept {
  r16_rows_scalar(a, kR16Tile, r0, r1, [](const uint8_t *tile, int l, const ActQ8KS &x, float acc) {
    uint16_t dh, dmh;
    std::memcpy(&dh, tile + kR16D + 2 * l, 2);
    std::memcpy(&dmh, tile + kR16Dmin + 2 * l, 2);
    const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(dmh);
    // As the AVX-512 kernel: the groups' exact sums times their scales added in float (each
    // product exact), the mins times the groups' activation sums in int32 (exact); then
    // (scaled * d - mins * dmin) * xd added.
    float scaled = 0.0f;
    int32_t mins = 0;
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, mn;
      r16_scale_min(tile, l, s, &sc, &mn);
      int32_t sum = 0;
      for (int c = 32 * s; c < 32 * s + 32; ++c)
        sum += ((tile[r16_nibble_byte(l, c)] >> (4 * ((c / 4) % 2))) & 15) * x.qs[c];
      scaled = std::fma(static_cast<float>(sum), static_cast<float>(sc), scaled);
      mins += mn * x.bsums[s];
    }
    return std::fma(std::fma(-static_cast<float>(mins), dmin, scaled * d), x.d, acc);
  });
}

void q6k_r16_rows_scalar(const PackedArgsQ6R16 &a, int64_t r0, int64_t r1) noexcept {
  r16_rows_scalar(a, kQ6R16Tile, r0, r1,
                  [](const uint8_t *tile, int l, const ActQ8K &x, float acc) {
                    uint16_t dh;
                    std::memcpy(&dh, tile + kQ6R16D + 2 * l, 2);
                    // As the AVX-512 kernel: each group's exact sum (the values' offset of 32 taken
                    // off as 32 times the activations' group sum) times its scale, added in float
                    // (each product exact); then scaled * d * xd added.
                    float scaled = 0.0f;
                    for (int g = 0; g < 16; ++g) {
                      int32_t sum = -32 * x.bsums[g];
                      for (int c = 16 * g; c < 16 * g + 16; ++c)
                        sum += q6k_r16_value(tile, l, c) * x.qs[c];
                      const auto sc = static_cast<int8_t>(tile[kQ6R16Scales + 16 * g + l]);
                      scaled = std::fma(static_cast<float>(sum), static_cast<float>(sc), scaled);
                    }
                    return std::fma(scaled * fp16_to_fp32(dh), x.d, acc);
                  });
}

void q6k_x16_rows_scalar(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int64_t t = 0; t < a.n_tok; ++t) {
      const ActQ8K16 *x = a.x + t * a.n_blocks;
      float acc[8] = {};
      for (int64_t i = 0; i < a.n_blocks; ++i) {
        const uint8_t *blk = row + static_cast<size_t>(i) * sizeof(BlockQ6_K);
        uint16_t dh;
        std::memcpy(&dh, blk + 208, 2);
        const float dx = fp16_to_fp32(dh) * x[i].d;
        for (int lane = 0; lane < 8; ++lane) {  // int32 lane l: groups 2l and 2l + 1
          int32_t sum = 0;
          for (int g = 2 * lane; g < 2 * lane + 2; ++g) {
            int32_t gs = 0;
            for (int k = 0; k < 8; ++k)
              for (int j = 0; j < 2; ++j)
                gs += q6k_x16_get(blk, g, k, j) * x[i].qs[32 * k + 2 * g + j];
            sum += static_cast<int8_t>(blk[192 + g]) * (gs - 32 * x[i].bsums[g]);
          }
          // As the AVX2 kernel: fma(int sum, d * xd, acc).
          acc[lane] = std::fma(static_cast<float>(sum), dx, acc[lane]);
        }
      }
      const float h0 = acc[0] + acc[4], h1 = acc[1] + acc[5], h2 = acc[2] + acc[6],
                  h3 = acc[3] + acc[7];
      a.y[t * a.y_stride + r] = (h0 + h2) + (h1 + h3);
    }
  }
}

void q40_x4_rows_scalar(const PackedArgsX4 &a, int64_t r0, int64_t r1) noexcept {
  constexpr size_t kSuper = 4 * sizeof(BlockQ4_0);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int64_t t = 0; t < a.n_tok; ++t) {
      const ActQ8X4 *x = a.x + t * a.n_blocks;
      float acc[8] = {};
      for (int64_t i = 0; i < a.n_blocks; ++i) {
        const uint8_t *sb = row + static_cast<size_t>(i) * kSuper;
        for (int lane = 0; lane < 8; ++lane) {
          const int g = lane / 2, h = lane % 2;
          uint16_t dh;
          std::memcpy(&dh, sb + 2 * g, 2);
          int32_t sum = 0;
          for (int k = 0; k < 4; ++k)
            for (int j = 0; j < 4; ++j) {
              const int byte = 8 * g + 4 * h + j;  // within chunk k / 2
              const int q = (sb[8 + 32 * (k / 2) + byte] >> (4 * (k % 2))) & 15;
              sum += q * x[i].qs[32 * k + 8 * g + 4 * h + j];
            }
          sum -= x[i].osum[lane];
          // As the AVX2 kernel: fma(int sum, d * xd, acc).
          acc[lane] =
              std::fma(static_cast<float>(sum), fp16_to_fp32(dh) * x[i].xd[lane], acc[lane]);
        }
      }
      const float h0 = acc[0] + acc[4], h1 = acc[1] + acc[5], h2 = acc[2] + acc[6],
                  h3 = acc[3] + acc[7];
      a.y[t * a.y_stride + r] = (h0 + h2) + (h1 + h3);
    }
  }
}

PackedKernels packed_kernels(Isa isa) noexcept {
  PackedKernels k;
  if (isa == Isa::avx512) {
    k.q4k_x8 = q4k_x8_rows_avx512;
    k.q4k_r16 = q4k_r16_rows_avx512;
    k.q32_r16 = q32_r16_rows_avx512;
    k.q40_x4 = q40_x4_rows_avx512;
    k.q6k_x16 = avx512_split() ? q6k_x16_rows_avx512_split : q6k_x16_rows_avx512;
    k.q6k_r16 = q6k_r16_rows_avx512;
    k.simd_prep = true;
  } else if (isa == Isa::avx2) {
    k.q4k_x8 = q4k_x8_rows_avx2;
    k.q4k_r16 = q4k_r16_rows_scalar;
    k.q32_r16 = q32_r16_rows_avx2;
    k.q40_x4 = q40_x4_rows_avx2;
    k.q6k_x16 = q6k_x16_rows_avx2;
    k.q6k_r16 = q6k_r16_rows_scalar;
    k.simd_prep = true;
  } else {
    k.q4k_x8 = q4k_x8_rows_scalar;
    k.q4k_r16 = q4k_r16_rows_scalar;
    k.q32_r16 = q32_r16_rows_scalar;
    k.q40_x4 = q40_x4_rows_scalar;
    k.q6k_x16 = q6k_x16_rows_scalar;
    k.q6k_r16 = q6k_r16_rows_scalar;
  }
  return k;
}

namespace {

// Activation buffers for one matmul: the calling thread's, kept between calls (no allocation or
// zeroing per matmul; a verification pass runs about 200), or fresh ones when that thread is
// already inside a matmul (it can run another's task while it waits for its own, if callers nest
// parallel work). Workers read the buffers while the caller waits, so they outlive their use.
class ActBuffers {
 public:
  ActBuffers() : reuse_(!busy()) { busy() = busy() || reuse_; }
  ~ActBuffers() {
    if (reuse_) busy() = false;
  }
  ActBuffers(const ActBuffers &) = delete;
  ActBuffers &operator=(const ActBuffers &) = delete;
  // n elements of T; k separates the buffers of one call.
  template <class T, int k>
  T *get(size_t n) {
    if (!reuse_) {
      auto &own = std::get<k>(own_);
      own.resize(n * sizeof(T) + alignof(T));
      void *p = own.data();
      size_t space = own.size();
      return static_cast<T *>(std::align(alignof(T), n * sizeof(T), p, space));
    }
    thread_local std::vector<T> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
  }

 private:
  static bool &busy() {
    thread_local bool b = false;
    return b;
  }
  bool reuse_;
  std::tuple<std::vector<uint8_t>, std::vector<uint8_t>> own_;
};

// n_tok tokens of cols values (x) to ActQ8 blocks, cols / 32 per token (q).
void quantize_tokens_q8(bool simd, const float *x, int64_t n_tok, int64_t cols, ActQ8 *q) {
  for (int64_t t = 0; t < n_tok; ++t) {
    if (simd)
      quantize_act_q8_avx2(x + t * cols, q + t * (cols / 32), cols);
    else
      quantize_act_q8(x + t * cols, q + t * (cols / 32), cols);
  }
}

// The layouts over Q8_K activations (q4k_x8, q6k_x16, q4k_r16, q6k_r16): quantizes every token
// to Q8_K, permutes the blocks into the layout's order (Act, by prep; q6k_r16 takes them as they
// are, Act = ActQ8K and no prep) and runs fn over the rows, in whole groups of kUnit.
template <class Args, class Act, int64_t kUnit = 4>
void run_q8k_layout(const PackedWeight &pw, bool simd, const float *x, int64_t n_tok, float *y,
                    void (*prep)(const ActQ8K *, Act *, int64_t) noexcept,
                    void (*fn)(const Args &, int64_t, int64_t) noexcept) {
  Args a;
  a.w = pw.data;
  a.row_bytes = pw.row_bytes;
  a.n_blocks = pw.cols / kQKK;
  a.n_tok = n_tok;
  a.y_stride = pw.rows;
  a.y = y;
  const auto n = static_cast<size_t>(n_tok * a.n_blocks);
  ActBuffers buffers;
  ActQ8K *q = buffers.get<ActQ8K, 0>(n);
  for (int64_t t = 0; t < n_tok; ++t) {
    if (simd)
      quantize_act_q8k_avx2(x + t * pw.cols, q + t * a.n_blocks, pw.cols);
    else
      quantize_act_q8k(x + t * pw.cols, q + t * a.n_blocks, pw.cols);
  }
  if constexpr (std::is_same_v<Act, ActQ8K>) {
    a.x = q;
  } else {
    Act *xp = buffers.get<Act, 1>(n);
    prep(q, xp, static_cast<int64_t>(n));
    a.x = xp;
  }
  for_row_ranges<kUnit>(pw.rows, pw.row_bytes, [&](int64_t r0, int64_t r1) { fn(a, r0, r1); });
}

}  // namespace

void matmul_packed_kernels(const PackedKernels &k, const PackedWeight &pw, const float *x,
                           int64_t n_tok, float *y) {
  if (pw.layout == PackLayout::plain)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "matmul: weights not packed");
  if (x == nullptr || y == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "matmul: NULL input or output");
  if (n_tok <= 0 || n_tok > (int64_t{1} << 24))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "matmul: %lld tokens", static_cast<long long>(n_tok));
  const bool simd = k.simd_prep;
  if (pw.layout == PackLayout::q40_x4) {
    PackedArgsX4 a;
    a.w = pw.data;
    a.row_bytes = pw.row_bytes;
    a.n_blocks = pw.cols / 128;
    a.n_tok = n_tok;
    a.y_stride = pw.rows;
    a.y = y;
    const auto n = static_cast<size_t>(n_tok * a.n_blocks);
    ActBuffers buffers;
    ActQ8 *q = buffers.get<ActQ8, 0>(4 * n);
    ActQ8X4 *xp = buffers.get<ActQ8X4, 1>(n);
    quantize_tokens_q8(simd, x, n_tok, pw.cols, q);
    act_to_q8x4(q, xp, static_cast<int64_t>(n));
    a.x = xp;
    const auto fn = k.q40_x4;
    for_row_ranges(pw.rows, pw.row_bytes, [&](int64_t r0, int64_t r1) { fn(a, r0, r1); });
    return;
  }
  if (pw.layout == PackLayout::q32_r16) {
    PackedArgsQ32 a;
    a.wtype = pw.wtype;
    a.w = pw.data;
    a.n_blocks = pw.cols / 32;
    a.n_tok = n_tok;
    a.y_stride = pw.rows;
    a.y = y;
    ActBuffers buffers;
    ActQ8 *q = buffers.get<ActQ8, 0>(static_cast<size_t>(n_tok * a.n_blocks));
    quantize_tokens_q8(simd, x, n_tok, pw.cols, q);
    a.x = q;
    const auto fn = k.q32_r16;
    for_row_ranges<16>(pw.rows, pw.row_bytes, [&](int64_t r0, int64_t r1) { fn(a, r0, r1); });
    return;
  }
  if (pw.layout == PackLayout::q4k_r16) {
    run_q8k_layout<PackedArgsR16, ActQ8KS, 16>(pw, simd, x, n_tok, y, act_to_q8ks, k.q4k_r16);
    return;
  }
  if (pw.layout == PackLayout::q6k_r16) {
    run_q8k_layout<PackedArgsQ6R16, ActQ8K, 16>(pw, simd, x, n_tok, y, nullptr, k.q6k_r16);
    return;
  }
  if (pw.layout == PackLayout::q6k_x16)
    run_q8k_layout<PackedArgsQ6, ActQ8K16>(pw, simd, x, n_tok, y, act_to_q8k16, k.q6k_x16);
  else
    run_q8k_layout<PackedArgs, ActQ8KP>(pw, simd, x, n_tok, y,
                                        simd ? act_to_q8kp_avx2 : act_to_q8kp, k.q4k_x8);
}

void matmul_packed_with(Isa isa, const PackedWeight &pw, const float *x, int64_t n_tok, float *y) {
  if (pw.layout == PackLayout::plain) {
    matmul_with(isa, MatmulPath::automatic, pw.wtype, pw.data, pw.rows, pw.cols, x, n_tok, y);
    return;
  }
  if (!isa_available(isa))
    fail(SPECINFER_ERR_UNSUPPORTED, "matmul: this CPU cannot run %s kernels", isa_name(isa));
  matmul_packed_kernels(packed_kernels(isa), pw, x, n_tok, y);
}

void matmul_packed(const PackedWeight &pw, const float *x, int64_t n_tok, float *y) {
  matmul_packed_with(active_isa(), pw, x, n_tok, y);
}

}  // namespace specinfer
