// Tests of the `specinfer` tool's PNG line-chart writer (tools/specinfer/png_chart.cpp, used by
// sketch-eval and bench charts): checksums against published check values, the deflate stream
// against an independent minimal inflater written here, the PNG chunk structure, and rendering.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../tools/specinfer/png_chart.cpp"

#include "support/cmocka_setup.h"

namespace {

// A minimal inflater for zlib streams of stored and fixed-Huffman blocks (all the writer makes).
// Returns false on any malformation.
struct BitReader {
  const uint8_t *p;
  size_t n, pos = 0;  // pos in bits
  bool ok = true;
  uint32_t bit() {
    if (pos >= 8 * n) {
      ok = false;
      return 0;
    }
    const uint32_t b = (p[pos >> 3] >> (pos & 7)) & 1;
    ++pos;
    return b;
  }
  uint32_t bits(int k) {  // least significant first
    uint32_t v = 0;
    for (int i = 0; i < k; ++i) v |= bit() << i;
    return v;
  }
  uint32_t code(int k) {  // most significant first (Huffman codes)
    uint32_t v = 0;
    for (int i = 0; i < k; ++i) v = (v << 1) | bit();
    return v;
  }
};

int fixed_symbol(BitReader &br) {
  uint32_t c = br.code(7);
  if (c <= 0x17) return 256 + static_cast<int>(c);
  c = (c << 1) | br.bit();
  if (c >= 0x30 && c <= 0xBF) return static_cast<int>(c - 0x30);
  if (c >= 0xC0 && c <= 0xC7) return 280 + static_cast<int>(c - 0xC0);
  c = (c << 1) | br.bit();
  if (c >= 0x190 && c <= 0x1FF) return 144 + static_cast<int>(c - 0x190);
  br.ok = false;
  return -1;
}

bool inflate_zlib(const std::vector<uint8_t> &z, std::vector<uint8_t> &out) {
  if (z.size() < 6 || (z[0] & 0x0f) != 8 || ((z[0] << 8) | z[1]) % 31 != 0) return false;
  BitReader br{z.data() + 2, z.size() - 6};
  bool last = false;
  while (!last && br.ok) {
    last = br.bit();
    const uint32_t type = br.bits(2);
    if (type == 0) {
      br.pos = (br.pos + 7) & ~size_t{7};
      const uint32_t len = br.bits(16), nlen = br.bits(16);
      if ((len ^ 0xffff) != nlen) return false;
      for (uint32_t i = 0; i < len; ++i) out.push_back(static_cast<uint8_t>(br.bits(8)));
    } else if (type == 1) {
      while (br.ok) {
        const int sym = fixed_symbol(br);
        if (sym < 0) return false;
        if (sym < 256) {
          out.push_back(static_cast<uint8_t>(sym));
          continue;
        }
        if (sym == 256) break;
        const int li = sym - 257;
        if (li > 28) return false;
        const int len = pngchart::kLenBase[li] + static_cast<int>(br.bits(pngchart::kLenExtra[li]));
        const uint32_t di = br.code(5);
        if (di > 29) return false;
        const size_t dist = pngchart::kDistBase[di] + br.bits(pngchart::kDistExtra[di]);
        if (dist > out.size()) return false;
        for (int k = 0; k < len; ++k) out.push_back(out[out.size() - dist]);
      }
    } else {
      return false;
    }
  }
  if (!br.ok) return false;
  const size_t t = z.size() - 4;
  const uint32_t want =
      static_cast<uint32_t>(z[t]) << 24 | z[t + 1] << 16 | z[t + 2] << 8 | z[t + 3];
  return want == pngchart::adler32(out.data(), out.size());
}

uint32_t be32(const uint8_t *p) {
  return static_cast<uint32_t>(p[0]) << 24 | p[1] << 16 | p[2] << 8 | p[3];
}

void test_checksums(void **) {
  const char *check = "123456789";
  assert_int_equal(pngchart::crc32(reinterpret_cast<const uint8_t *>(check), 9), 0xCBF43926u);
  assert_int_equal(pngchart::adler32(reinterpret_cast<const uint8_t *>("Wikipedia"), 9),
                   0x11E60398u);
  // Incremental use agrees with one pass.
  const uint32_t part = pngchart::crc32(reinterpret_cast<const uint8_t *>(check), 4);
  assert_int_equal(pngchart::crc32(reinterpret_cast<const uint8_t *>(check) + 4, 5, part),
                   0xCBF43926u);
  // Adler-32 over more than 5552 bytes of 0xff (the modulo-deferral boundary).
  std::vector<uint8_t> ff(20000, 0xff);
  uint32_t a = 1, b = 0;
  for (uint8_t v : ff) {
    a = (a + v) % 65521;
    b = (b + a) % 65521;
  }
  assert_int_equal(pngchart::adler32(ff.data(), ff.size()), b << 16 | a);
}

void test_deflate_round_trip(void **) {
  std::vector<std::vector<uint8_t>> inputs;
  inputs.push_back({});
  inputs.push_back({42});
  std::vector<uint8_t> text;
  for (int i = 0; i < 3000; ++i) text.push_back(static_cast<uint8_t>("abcabcabd"[i % 9]));
  inputs.push_back(text);
  std::vector<uint8_t> noise(100000);
  uint32_t s = 7;
  for (auto &v : noise) {
    s = s * 1103515245u + 12345u;
    v = static_cast<uint8_t>(s >> 24);
  }
  inputs.push_back(noise);
  std::vector<uint8_t> runs(70000, 0);  // long runs: distances up to the 32K window
  for (size_t i = 0; i < runs.size(); i += 33000) runs[i] = 9;
  inputs.push_back(runs);
  for (const auto &in : inputs) {
    const auto z = pngchart::zlib_compress(in.data(), in.size());
    std::vector<uint8_t> out;
    assert_true(inflate_zlib(z, out));
    assert_int_equal(out.size(), in.size());
    assert_true(out == in);
  }
  // Redundant data compresses.
  const auto zr = pngchart::zlib_compress(runs.data(), runs.size());
  assert_true(zr.size() < runs.size() / 20);
}

void test_png_structure(void **) {
  pngchart::Image img(13, 7, 0x102030);
  img.set(3, 4, 0xff0000);
  img.set(-1, 100, 0x00ff00);  // outside: ignored
  assert_int_equal(img.get(3, 4), 0xff0000u);
  const auto png = pngchart::encode_png(img);
  const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  assert_memory_equal(png.data(), sig, 8);
  size_t pos = 8;
  std::vector<std::string> types;
  std::vector<uint8_t> idat;
  while (pos + 12 <= png.size()) {
    const uint32_t len = be32(&png[pos]);
    const std::string type(reinterpret_cast<const char *>(&png[pos + 4]), 4);
    assert_true(pos + 12 + len <= png.size());
    assert_int_equal(be32(&png[pos + 8 + len]), pngchart::crc32(&png[pos + 4], 4 + len));
    if (type == "IHDR") {
      assert_int_equal(len, 13);
      assert_int_equal(be32(&png[pos + 8]), 13);
      assert_int_equal(be32(&png[pos + 12]), 7);
      assert_int_equal(png[pos + 16], 8);
      assert_int_equal(png[pos + 17], 2);
    }
    if (type == "IDAT") idat.insert(idat.end(), png.begin() + pos + 8, png.begin() + pos + 8 + len);
    types.push_back(type);
    pos += 12 + len;
  }
  assert_int_equal(pos, png.size());
  assert_true(types.size() == 3 && types[0] == "IHDR" && types[1] == "IDAT" && types[2] == "IEND");
  std::vector<uint8_t> raw;
  assert_true(inflate_zlib(idat, raw));
  assert_int_equal(raw.size(), 7 * (1 + 13 * 3));
  const uint8_t *px = &raw[4 * (1 + 39) + 1 + 3 * 3];
  assert_int_equal(raw[4 * 40], 0);  // filter type none
  assert_int_equal(px[0], 0xff);
  assert_int_equal(px[1], 0x00);
  assert_int_equal(raw[1], 0x10);
}

size_t count_color(const pngchart::Image &img, uint32_t c) {
  size_t n = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) n += img.get(x, y) == c;
  return n;
}

void test_render(void **) {
  pngchart::Chart chart;
  chart.title = "Error vs storage";
  chart.x_label = "storage";
  chart.y_label = "error";
  chart.log_y = true;
  chart.series.push_back({"one", {1, 2, 3, 4}, {0.1, 0.05, 0.02, 0.01}, 0x123456, true});
  chart.series.push_back(
      {"two", {1, 2, 3, 4}, {0.2, -1.0, NAN, 0.02}, 0x654321, false});  // bad points skipped
  const pngchart::Image img = pngchart::render(chart);
  assert_int_equal(img.width, 900);
  assert_int_equal(img.height, 560);
  assert_true(count_color(img, 0x123456) > 200);  // line, markers and the legend swatch
  assert_true(count_color(img, 0x654321) > 20);
  // Text draws pixels and has the promised width.
  pngchart::Image t(100, 20);
  const int w = pngchart::draw_text(t, 1, 1, "Ab1", 0x000000);
  assert_int_equal(w, pngchart::text_width("Ab1"));
  assert_int_equal(w, 17);
  assert_true(count_color(t, 0x000000) > 10);
  // Degenerate charts render without trouble.
  pngchart::Chart empty;
  empty.width = 10;  // raised to the minimum
  assert_int_equal(pngchart::render(empty).width, 200);
  pngchart::Chart flat;
  flat.log_x = true;
  flat.series.push_back({"flat", {5, 5}, {3, 3}, 0, true});
  assert_true(count_color(pngchart::render(flat), 0x1f77b4) > 0);
  std::string err;
  assert_false(pngchart::write_png("/nonexistent-dir/x.png", chart, &err));
  assert_false(err.empty());
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checksums),
      cmocka_unit_test(test_deflate_round_trip),
      cmocka_unit_test(test_png_structure),
      cmocka_unit_test(test_render),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
