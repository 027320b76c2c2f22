// Weights repacked once, at model load, into layouts that the matmul kernels read with less work
// than the file's own. Repacking is lossless (the same integers and scales, reordered), so packed
// and plain matmuls compute the same exact integer sums; only the float summation order differs.
//
// Layouts:
//  q4k_x8 (Q4_K): the same 144-byte super-blocks with the same d and dmin; the 12 bytes of scales
//    and mins hold the same sixteen 6-bit values in an order that decodes with a few vector
//    instructions (x8_scale_min: byte s = scale s | the low 2 bits of min s << 6, bytes 8..11 the
//    mins' high 4 bits, two per byte) instead of the scalar shifts of the K-quant order (which take
//    a sixth of the kernel's time on 8960-column rows). The 128 nibble bytes are reordered. Nibble
//    register k (k = 0..7: register 2c is the low nibbles of bytes 32c..32c+31, register 2c+1 their
//    high nibbles) holds in bytes 4s..4s+3 the values 4k..4k+3 of group s (s = 0..7). Activations
//    are permuted the same way (ActQ8KP), so that every 16-bit lane of a vpmaddubsw product belongs
//    to one group in all eight registers: the eight products of a super-block add up in int16 (at
//    most 16 * 15 * 127 = 30480 per lane) and a single vpmaddwd applies the eight group scales. One
//    vpmaddwd per 256 weights and token instead of four, and no lane permutes when unpacking. (Zen
//    3 issues vpmaddubsw, vpmaddwd and FMAs on the same two pipes, two per cycle; bench_kernels
//    BM_PipeThroughput measures it.)
//  q40_x4 (Q4_0, columns a multiple of 128): four consecutive 18-byte blocks (a group each) become
//    one 72-byte super-block: the four fp16 scales, then 64 nibble bytes. Byte 8g + i of 32-byte
//    chunk c holds value 16c + i of group g in its low nibble and value 16c + 8 + i in its high
//    nibble (g = 0..3, i = 0..7). Activations are permuted the same way (ActQ8X4): in each of the
//    four vpmaddubsw products of a super-block, int16 lanes 4g..4g+3 belong to group g, so the four
//    products add up in int16 (at most 4 * 2 * 15 * 127 = 15240), one vpmaddwd gives two int32 sums
//    per group, and one float multiply-add applies the four groups' scales: 12 instructions per 128
//    weights and token instead of about 44 for four separate blocks. The values stay unsigned
//    (0..15) and the -8 offset comes off the exact integer sums (ActQ8X4::osum). Same bytes as
//    the file's layout.
//  q6k_x16 (Q6_K where q6k_r16 does not apply): the same 210-byte super-blocks, the sixteen int8
//    scales and d at the file's offsets (bytes 192..207, 208..209); the 6-bit values are reordered
//    so that register k (k = 0..7) holds in int16 lane g the values 16g + 2k and 16g + 2k + 1 of
//    group g (a 16-value group with its own scale). Bytes 0..127 (4 chunks of 32): byte 2g + j of
//    chunk c holds in its low nibble the low 4 bits of value 16g + 4c + j (register 2c) and in its
//    high nibble those of value 16g + 4c + 2 + j (register 2c + 1). Bytes 128..191 (2 chunks of
//    32): bits 2i, 2i + 1 of byte 2g + j of chunk h are the high 2 bits of value 16g + 8h + 2i + j
//    (register 4h + i). Activations are permuted the same way (ActQ8K16), so every int16 lane of a
//    vpmaddubsw product belongs to one group: two registers' products add up in int16 (at most
//    2 * 2 * 63 * 128 = 32256) and one vpmaddwd by the sixteen scales, loaded as they are, applies
//    them; the file's order needs blends, byte shuffles and per-register scale shuffles for the
//    same (12 fewer instructions per super-block, and the scale setup shrinks from ~11 to 3).
//  q4k_r16 (Q4_K, rows a multiple of 16, chosen when the AVX-512 kernels run): sixteen rows
//    interleaved, so that a 32-bit lane of a 512-bit register is a row. Tile (G, i) (2304 bytes =
//    16 super-blocks, at (G * n_blocks + i) * 2304) holds super-block i of rows 16G..16G+15:
//    bytes 256s + 64q + 4l + v (group s = 0..7, q = 0..3, row l = 0..15, v = 0..3) hold in the low
//    nibble the value of row l at column 32s + 8q + v and in the high nibble that at
//    32s + 8q + 4 + v; bytes 2048 + 16s + l = scale(l, s) | (min(l, s) & 3) << 6; bytes
//    2176 + 16j + l = min(l, 2j) >> 2 | (min(l, 2j + 1) >> 2) << 4; then the sixteen rows' d
//    (fp16, bytes 2240..2271) and dmin (2272..2303). Same bytes as the file's. The kernel
//    multiplies a register of sixteen rows' four values by four activation bytes broadcast to
//    every lane (vpdpbusd): eight per group and token give the sixteen rows' exact group sums,
//    with no permutes, broadcasts of registers or horizontal sums; one multiply-add per group and
//    token (the exact sum times the scale) and, per super-block and token, four vpdpwssd (the mins
//    times the activations' group sums, exact) and three float steps serve sixteen rows at once.
//    Activations stay in the file's order (ActQ8KS).
//  q32_r16 (Q4_0, Q5_0, Q8_0, Q3_0: blocks of 32 with one fp16 scale; rows a multiple of 16,
//    chosen when the AVX-512 kernels run for Q5_0, Q8_0, Q3_0 and Q4_0 whose columns are not a
//    multiple of 128): sixteen rows interleaved as in q4k_r16, a 32-bit lane of a register per
//    row. Tile (G, i) (at (G * n_blocks + i) * tile bytes) holds block i of rows 16G..16G+15, the
//    values unsigned (q + 128 for Q8_0; the others keep theirs) so that vpdpbusd multiplies them
//    by the signed activations, the offset (8, 16, 128, 4) coming off the exact sums as offset *
//    (sum of the token's 32 values). Q4_0 (288 bytes) and Q5_0 (352): bytes 64q + 4l + v (q =
//    0..3) hold in the low nibble the low 4 bits of row l's value at column 8q + v and in the high
//    nibble those of column 8q + 4 + v; Q5_0 then 64 bytes of fifth bits: bit c of byte 4l + v is
//    the fifth bit of row l's value at column 4c + v (register c: columns 4c .. 4c + 3, c = 2q
//    the low nibbles, 2q + 1 the high ones), so that a shift and an AND give register c's 16s in
//    place, in 512- and 256-bit registers alike. Q8_0 (544): byte 64c + 4l + v is row l's value
//    at column 4c + v, plus 128. Q3_0 (224): bytes 64h + 4l + v (h = 0, 1) hold in bits 2k,
//    2k + 1 the low two bits of row l's value at column 16h + 4k + v (register c = 4h + k), then
//    64 bytes of third bits laid out as Q5_0's fifth bits. Then the sixteen rows' d (fp16). Same
//    bytes as the file's. Per block and token: eight vpdpbusd with four activation bytes
//    broadcast, one conversion and one multiply-add for sixteen rows (the plain kernels: a
//    vpdpbusd, sign fixes, lane inserts and a horizontal sum per row and two blocks). Also chosen
//    for Q5_0, Q3_0 and those Q4_0 matrices when the AVX2 kernels run: they take the tile as two
//    halves of eight rows (the low and high 32 bytes of every 64), vpmaddubsw products of four
//    registers added in int16 (at most 4 * 2 * 31 * 127 = 31496), one vpmaddwd per four.
//  q6k_r16 (Q6_K, rows a multiple of 16, chosen when the AVX-512 kernels run): sixteen rows
//    interleaved as in q4k_r16, a 32-bit lane of a register per row. Tile (G, i) (3392 bytes at
//    (G * n_blocks + i) * 3392) holds super-block i of rows 16G..16G+15: bytes 0..2047 the low 4
//    bits of the values (0..63) at q4k_r16's places (r16_nibble_byte); bytes 2048 + 64g + 4l + v
//    (group g = 0..15 of 16 columns, v = 0..3) their high 2 bits, bits 2k, 2k + 1 for row l's value
//    at column 16g + 4k + v (so that one 64-byte register holds a group's high bits, and 16-bit
//    shifts by 4, 2, 0, -2 and an AND put value register k's in place); bytes 3072 + 16g + l the
//    int8 scale of row l, group g; the sixteen rows' d (fp16, bytes 3328..3359); then 32 bytes
//    of zeros, so that every tile starts on a cache line (16 x 210 = 3360 bytes would start every
//    other tile mid-line, and each of its 64-byte loads would span two lines). Per group and
//    token: four vpdpbusd with four activation bytes broadcast, started from -32 times
//    the token's group sum (the values' offset, exact), and one multiply-add by the sixteen
//    scales; per super-block and token one multiply-add by d * xd. Activations stay in the file's
//    order (ActQ8K), group sums included. The same values, scales and d as the file's.
//  plain: every other type, and Q4_0 / Q5_0 / Q8_0 where none of the above applies; the handle
//    refers to the caller's weights and the ordinary kernels (matmul.h) run.
// With AVX-512 VL + VNNI (packed_avx512.cpp) the layouts keep their meaning. In q4k_x8 and q40_x4
// a 32-bit lane of a register holds four values of one group, so vpdpbusd forms the same int32
// group sums the AVX2 kernels form with vpmaddubsw, int16 adds and vpmaddwd, in one instruction
// per register and token. In q6k_x16 a 32-bit lane spans two groups; there vpdpwssd applies the
// scales to the int16 sums and adds in one instruction (vpmaddwd + vpaddd in AVX2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/quant.h"
#include "util/isa.h"

namespace specinfer {

enum class PackLayout : int32_t {
  plain = 0,
  q4k_x8 = 1,
  q40_x4 = 2,
  q6k_x16 = 3,
  q4k_r16 = 4,
  q32_r16 = 5,
  q6k_r16 = 6
};

// Q8_K activations in the q4k_x8 order: qs permuted (register k, bytes 4s..4s+3 = values
// 32s + 4k .. 32s + 4k + 3), xs[s] = d * (sum of group s's 32 values), then d.
struct alignas(32) ActQ8KP {
  int8_t qs[256];
  float xs[8];
  float d;
};

// Q8_K activations for q4k_r16: qs in the file's order, bsums[s] = the sum of group s's 32
// values (|sum| <= 32 * 127 fits int16; two of them form a vpdpwssd operand), then d.
struct alignas(32) ActQ8KS {
  int8_t qs[256];
  int16_t bsums[8];
  float d;
};

// ActQ8 activations (four blocks) in the q40_x4 order: qs[32k + 8g + i] = value 8k + i of group g;
// xd[2g + h] = group g's scale d (twice: the two int32 lanes of a group); osum[2g + h] = 8 x the
// sum of the values that land in int32 lane 2g + h (values 8k + 4h + j, k, j = 0..3).
struct alignas(32) ActQ8X4 {
  int8_t qs[128];
  float xd[8];
  int32_t osum[8];
};

// Q8_K activations in the q6k_x16 order: qs[32k + 2g + j] = value 16g + 2k + j (register k, int16
// lane g), the sixteen group sums and d as in ActQ8K.
struct alignas(32) ActQ8K16 {
  int8_t qs[256];
  int16_t bsums[16];
  float d;
};

struct PackedWeight {
  int32_t wtype = 0;
  PackLayout layout = PackLayout::plain;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  size_t packed_bytes = 0;        // the size of the packed copy (0 for the plain layout)
  const uint8_t *data = nullptr;  // packed copy (owned below) or the caller's weights
  struct Free {
    void operator()(uint8_t *p) const noexcept;
  };
  std::unique_ptr<uint8_t, Free> owned;
};

// Which layout an n_rows x n_cols matrix of wtype packs to for kernels of isa.
PackLayout pack_layout(int32_t wtype, int64_t n_rows, int64_t n_cols, Isa isa) noexcept;

// Packs w (n_rows x n_cols of wtype; rows in parallel on the caller's task arena). For the plain
// layout nothing is copied and w must outlive the result. Throws specinfer::Error like matmul
// (INVALID_ARGUMENT for NULL or bad sizes, UNSUPPORTED for an unknown type), OUT_OF_MEMORY.
std::unique_ptr<PackedWeight> pack_weight(int32_t wtype, const void *w, int64_t n_rows,
                                          int64_t n_cols);
// The same in the layout for isa instead of the active set's (tests, benchmarks). Every kernel
// set runs every layout (scalar code where it has no kernel of its own for one).
std::unique_ptr<PackedWeight> pack_weight_for(Isa isa, int32_t wtype, const void *w, int64_t n_rows,
                                              int64_t n_cols);

// Y[t][r] = sum_c W[r][c] * X[t][c] with the active instruction set. A token's result does not
// depend on n_tok (batch invariance). Throws like matmul.
void matmul_packed(const PackedWeight &pw, const float *x, int64_t n_tok, float *y);
// The same with an explicit instruction set (tests, benchmarks).
void matmul_packed_with(Isa isa, const PackedWeight &pw, const float *x, int64_t n_tok, float *y);

// Offsets in a q4k_r16 tile (see the layout above), its size, and where row l's nibble of column
// c (0..255) lies: byte r16_nibble_byte(l, c), shift 4 * ((c / 4) % 2).
constexpr size_t kR16Scales = 2048, kR16MinHigh = 2176, kR16D = 2240, kR16Dmin = 2272,
                 kR16Tile = 2304;
inline int r16_nibble_byte(int l, int c) noexcept {
  return 256 * (c / 32) + 64 * ((c % 32) / 8) + 4 * l + c % 4;
}
// Scale and min of row l, group s (0..7) in a q4k_r16 tile.
inline void r16_scale_min(const uint8_t *tile, int l, int s, uint8_t *sc, uint8_t *mn) noexcept {
  const uint8_t e = tile[kR16Scales + 16 * s + l];
  *sc = static_cast<uint8_t>(e & 63);
  *mn = static_cast<uint8_t>((e >> 6) |
                             (((tile[kR16MinHigh + 16 * (s / 2) + l] >> (4 * (s & 1))) & 15) << 2));
}

// Scale and min of group s (0..7) from the 12 q4k_x8 scale bytes e (see the layout above).
inline void x8_scale_min(int s, const uint8_t *e, uint8_t *sc, uint8_t *mn) noexcept {
  *sc = static_cast<uint8_t>(e[s] & 63);
  *mn = static_cast<uint8_t>((e[s] >> 6) | (((e[8 + s / 2] >> (4 * (s & 1))) & 15) << 2));
}

// One Q4_K super-block (144 bytes) into the q4k_x8 order, and back (tests).
void pack_block_q4k_x8(const uint8_t *src, uint8_t *dst) noexcept;
void unpack_block_q4k_x8(const uint8_t *src, uint8_t *dst) noexcept;
// ActQ8K -> ActQ8KP (scalar; the AVX2 version must give the same bytes).
void act_to_q8kp(const ActQ8K *a, ActQ8KP *out, int64_t n_blocks) noexcept;
// Four Q4_0 blocks (72 bytes) into a q40_x4 super-block, and back (tests).
void pack_q40_x4(const uint8_t *src, uint8_t *dst) noexcept;
void unpack_q40_x4(const uint8_t *src, uint8_t *dst) noexcept;
// ActQ8 (4 * n_super blocks) -> ActQ8X4 (n_super).
void act_to_q8x4(const ActQ8 *a, ActQ8X4 *out, int64_t n_super) noexcept;

// One Q6_K super-block (210 bytes) into the q6k_x16 order, and back (tests).
void pack_block_q6k_x16(const uint8_t *src, uint8_t *dst) noexcept;
void unpack_block_q6k_x16(const uint8_t *src, uint8_t *dst) noexcept;
// ActQ8K -> ActQ8K16.
void act_to_q8k16(const ActQ8K *a, ActQ8K16 *out, int64_t n_blocks) noexcept;
// Super-block i of sixteen Q4_K rows (src, rows src_row_bytes apart) into a q4k_r16 tile, and
// back (tests).
void pack_tile_q4k_r16(const uint8_t *src, size_t src_row_bytes, int64_t i, uint8_t *tile) noexcept;
void unpack_tile_q4k_r16(const uint8_t *tile, uint8_t *dst, size_t dst_row_bytes,
                         int64_t i) noexcept;
// ActQ8K -> ActQ8KS.
void act_to_q8ks(const ActQ8K *a, ActQ8KS *out, int64_t n_blocks) noexcept;

// q6k_r16 tiles (see the layout above): offsets, size, and row l's value (0..63) at column c.
constexpr size_t kQ6R16High = 2048, kQ6R16Scales = 3072, kQ6R16D = 3328, kQ6R16Tile = 3392;
// Where the high 2 bits of row l's value at column c (0..255) lie: byte kQ6R16High +
// q6r16_high_byte(l, c), shift q6r16_high_shift(c) (value register k = (c % 16) / 4 of its group).
inline int q6r16_high_byte(int l, int c) noexcept {
  return 64 * (c / 16) + 4 * l + c % 4;
}
inline int q6r16_high_shift(int c) noexcept {
  return 2 * ((c % 16) / 4);
}
int q6k_r16_value(const uint8_t *tile, int l, int c) noexcept;
// Super-block i of sixteen Q6_K rows (src, rows src_row_bytes apart) into a q6k_r16 tile, and
// back (tests).
void pack_tile_q6k_r16(const uint8_t *src, size_t src_row_bytes, int64_t i, uint8_t *tile) noexcept;
void unpack_tile_q6k_r16(const uint8_t *tile, uint8_t *dst, size_t dst_row_bytes,
                         int64_t i) noexcept;

// q32_r16 tiles of wtype (Q4_0, Q5_0, Q8_0, Q3_0): size, where the sixteen d are, the offset of
// the stored values, and row l's stored (unsigned) value at column c (0..31).
constexpr size_t q32_r16_tile_bytes(int32_t wtype) noexcept {
  return wtype == SPECINFER_WTYPE_Q8_0   ? 544
         : wtype == SPECINFER_WTYPE_Q5_0 ? 352
         : wtype == SPECINFER_WTYPE_Q3_0 ? 224
                                         : 288;
}
constexpr size_t q32_r16_d_offset(int32_t wtype) noexcept {
  return q32_r16_tile_bytes(wtype) - 32;
}
constexpr int q32_r16_offset(int32_t wtype) noexcept {
  return wtype == SPECINFER_WTYPE_Q8_0   ? 128
         : wtype == SPECINFER_WTYPE_Q5_0 ? 16
         : wtype == SPECINFER_WTYPE_Q3_0 ? 4
                                         : 8;
}
int q32_r16_value(int32_t wtype, const uint8_t *tile, int l, int c) noexcept;
// Block i of sixteen rows of wtype (src, rows src_row_bytes apart) into a q32_r16 tile, and back
// (tests).
void pack_tile_q32_r16(int32_t wtype, const uint8_t *src, size_t src_row_bytes, int64_t i,
                       uint8_t *tile) noexcept;
void unpack_tile_q32_r16(int32_t wtype, const uint8_t *tile, uint8_t *dst, size_t dst_row_bytes,
                         int64_t i) noexcept;

// Row kernels for the q4k_x8 layout: rows [r0, r1) for n_tok tokens of x (n_cols / 256 blocks
// each), y[t * y_stride + r].
struct PackedArgs {
  const uint8_t *w = nullptr;
  size_t row_bytes = 0;
  int64_t n_blocks = 0, n_tok = 0, y_stride = 0;
  const ActQ8KP *x = nullptr;  // [n_tok][n_blocks]
  float *y = nullptr;
};
// The q40_x4 kernels take the same arguments with x pointing at ActQ8X4 [n_tok][n_blocks] and
// n_blocks counting super-blocks of 128.
struct PackedArgsX4 {
  const uint8_t *w = nullptr;
  size_t row_bytes = 0;
  int64_t n_blocks = 0, n_tok = 0, y_stride = 0;
  const ActQ8X4 *x = nullptr;
  float *y = nullptr;
};
// The q6k_x16 kernels: x points at ActQ8K16 [n_tok][n_blocks], n_blocks super-blocks of 256.
struct PackedArgsQ6 {
  const uint8_t *w = nullptr;
  size_t row_bytes = 0;
  int64_t n_blocks = 0, n_tok = 0, y_stride = 0;
  const ActQ8K16 *x = nullptr;
  float *y = nullptr;
};
// The q4k_r16 kernels: w points at the tiles, x at ActQ8KS [n_tok][n_blocks]; rows [r0, r1) are
// whole groups of sixteen.
struct PackedArgsR16 {
  const uint8_t *w = nullptr;
  size_t row_bytes = 0;  // per row on average (144 per super-block; tiles hold sixteen rows)
  int64_t n_blocks = 0, n_tok = 0, y_stride = 0;
  const ActQ8KS *x = nullptr;
  float *y = nullptr;
};
// The q6k_r16 kernels: w points at the tiles, x at ActQ8K [n_tok][n_blocks]; rows [r0, r1) are
// whole groups of sixteen.
struct PackedArgsQ6R16 {
  const uint8_t *w = nullptr;
  size_t row_bytes = 0;  // the file's (210 per super-block; tiles hold sixteen rows, padded)
  int64_t n_blocks = 0, n_tok = 0, y_stride = 0;
  const ActQ8K *x = nullptr;
  float *y = nullptr;
};
void q6k_r16_rows_scalar(const PackedArgsQ6R16 &a, int64_t r0, int64_t r1) noexcept;
void q6k_r16_rows_avx512(const PackedArgsQ6R16 &a, int64_t r0, int64_t r1) noexcept;
// The q32_r16 kernels: w points at the tiles of wtype, x at ActQ8 [n_tok][n_blocks] (blocks of
// 32); rows [r0, r1) are whole groups of sixteen.
struct PackedArgsQ32 {
  int32_t wtype = 0;
  const uint8_t *w = nullptr;
  int64_t n_blocks = 0, n_tok = 0, y_stride = 0;
  const ActQ8 *x = nullptr;
  float *y = nullptr;
};
void q32_r16_rows_scalar(const PackedArgsQ32 &a, int64_t r0, int64_t r1) noexcept;
void q32_r16_rows_avx512(const PackedArgsQ32 &a, int64_t r0, int64_t r1) noexcept;
// AVX2: Q4_0 and Q5_0 (Q8_0's values, up to 255, would overflow the int16 sums: scalar code).
void q32_r16_rows_avx2(const PackedArgsQ32 &a, int64_t r0, int64_t r1) noexcept;
void q4k_r16_rows_scalar(const PackedArgsR16 &a, int64_t r0, int64_t r1) noexcept;
void q4k_r16_rows_avx512(const PackedArgsR16 &a, int64_t r0, int64_t r1) noexcept;
void q6k_x16_rows_scalar(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept;
void q6k_x16_rows_avx2(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept;
// AVX-512 VL + VNNI: vpdpwssd applies the scales and adds (same bits as AVX2).
void q6k_x16_rows_avx512(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept;
// The same for CPUs that split 512-bit operations (avx512_split(), Zen 4): the 256-bit one-row
// kernel where it runs faster there (same bits).
void q6k_x16_rows_avx512_split(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept;
void q40_x4_rows_scalar(const PackedArgsX4 &a, int64_t r0, int64_t r1) noexcept;
void q40_x4_rows_avx2(const PackedArgsX4 &a, int64_t r0, int64_t r1) noexcept;
void q4k_x8_rows_scalar(const PackedArgs &a, int64_t r0, int64_t r1) noexcept;
void q4k_x8_rows_avx2(const PackedArgs &a, int64_t r0, int64_t r1) noexcept;
void act_to_q8kp_avx2(const ActQ8K *a, ActQ8KP *out, int64_t n_blocks) noexcept;
// AVX-512 VL + VNNI (vpdpbusd on 256-bit registers); bit-identical to the scalar and AVX2 ones.
void q40_x4_rows_avx512(const PackedArgsX4 &a, int64_t r0, int64_t r1) noexcept;
void q4k_x8_rows_avx512(const PackedArgs &a, int64_t r0, int64_t r1) noexcept;

// The row kernels of one instruction set for the packed layouts.
struct PackedKernels {
  void (*q4k_x8)(const PackedArgs &, int64_t, int64_t) noexcept = nullptr;
  void (*q40_x4)(const PackedArgsX4 &, int64_t, int64_t) noexcept = nullptr;
  void (*q6k_x16)(const PackedArgsQ6 &, int64_t, int64_t) noexcept = nullptr;
  void (*q4k_r16)(const PackedArgsR16 &, int64_t, int64_t) noexcept = nullptr;
  void (*q32_r16)(const PackedArgsQ32 &, int64_t, int64_t) noexcept = nullptr;
  void (*q6k_r16)(const PackedArgsQ6R16 &, int64_t, int64_t) noexcept = nullptr;
  bool simd_prep = false;  // prepare the activations with the AVX2 routines (same bytes as scalar)
};
// The packed row kernels of isa (one for every layout in each set).
PackedKernels packed_kernels(Isa isa) noexcept;
// matmul_packed_with for a packed (not plain) layout with explicit row kernels (tests: the
// emulated AVX-512 kernels). Throws like matmul.
void matmul_packed_kernels(const PackedKernels &k, const PackedWeight &pw, const float *x,
                           int64_t n_tok, float *y);

}  // namespace specinfer
