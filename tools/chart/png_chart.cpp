// Line charts rasterized by hand and written as PNG (see png_chart.h).
#include "png_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace pngchart {

namespace {

// ---- 5x7 bitmap font, ASCII 32..126. Each glyph: 7 rows, bit 4 = leftmost pixel. ----
const uint8_t kFont[95][7] = {
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, {0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04},
    {0x0A, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00}, {0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A},
    {0x04, 0x0F, 0x14, 0x0E, 0x05, 0x1E, 0x04}, {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03},
    {0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D}, {0x04, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00},
    {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}, {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08},
    {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00}, {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00},
    {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}, {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00},
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}, {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00},
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}, {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}, {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}, {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}, {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}, {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C},
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}, {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x04, 0x08},
    {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02}, {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00},
    {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08}, {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04},
    {0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E}, {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11},
    {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}, {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E},
    {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}, {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F},
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}, {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F},
    {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}, {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E},
    {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}, {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11},
    {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}, {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11},
    {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}, {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E},
    {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}, {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D},
    {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}, {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E},
    {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}, {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E},
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}, {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A},
    {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}, {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04},
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}, {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E},
    {0x00, 0x10, 0x08, 0x04, 0x02, 0x01, 0x00}, {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E},
    {0x04, 0x0A, 0x11, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F},
    {0x08, 0x04, 0x02, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F},
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}, {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E},
    {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}, {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E},
    {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}, {0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E},
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}, {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E},
    {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C}, {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12},
    {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}, {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11},
    {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}, {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E},
    {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10}, {0x00, 0x00, 0x0D, 0x13, 0x0F, 0x01, 0x01},
    {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}, {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E},
    {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}, {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D},
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}, {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A},
    {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}, {0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E},
    {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}, {0x02, 0x04, 0x04, 0x08, 0x04, 0x04, 0x02},
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}, {0x08, 0x04, 0x04, 0x02, 0x04, 0x04, 0x08},
    {0x00, 0x00, 0x08, 0x15, 0x02, 0x00, 0x00},
};

constexpr int kGlyphW = 5, kGlyphH = 7, kAdvance = 6;

const uint32_t kPalette[] = {0x1f77b4, 0xd62728, 0x2ca02c, 0xff7f0e, 0x9467bd,
                             0x8c564b, 0xe377c2, 0x17becf, 0x7f7f7f, 0xbcbd22};

// ---- PNG / zlib pieces ----

class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t> &out) : out_(out) {}
  void put(uint32_t value, int n) {  // n low bits of value, least significant first
    acc_ |= static_cast<uint64_t>(value) << nbits_;
    nbits_ += n;
    while (nbits_ >= 8) {
      out_.push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      nbits_ -= 8;
    }
  }
  void put_huffman(uint32_t code, int len) {  // Huffman codes go most significant bit first
    uint32_t rev = 0;
    for (int i = 0; i < len; ++i) rev |= ((code >> i) & 1u) << (len - 1 - i);
    put(rev, len);
  }
  void flush() {
    if (nbits_ > 0) out_.push_back(static_cast<uint8_t>(acc_));
    acc_ = 0;
    nbits_ = 0;
  }

 private:
  std::vector<uint8_t> &out_;
  uint64_t acc_ = 0;
  int nbits_ = 0;
};

void put_literal(BitWriter &bw, int sym) {  // the fixed literal/length code of RFC 1951 3.2.6
  if (sym < 144)
    bw.put_huffman(0x30 + sym, 8);
  else if (sym < 256)
    bw.put_huffman(0x190 + (sym - 144), 9);
  else if (sym < 280)
    bw.put_huffman(sym - 256, 7);
  else
    bw.put_huffman(0xC0 + (sym - 280), 8);
}

const int kLenBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                          31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
const int kLenExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                           2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
const int kDistBase[30] = {1,    2,    3,    4,    5,    7,    9,    13,    17,    25,
                           33,   49,   65,   97,   129,  193,  257,  385,   513,   769,
                           1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
const int kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                            6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

void put_match(BitWriter &bw, int len, int dist) {
  int li = 28;
  while (kLenBase[li] > len) --li;
  put_literal(bw, 257 + li);
  bw.put(static_cast<uint32_t>(len - kLenBase[li]), kLenExtra[li]);
  int di = 29;
  while (kDistBase[di] > dist) --di;
  bw.put_huffman(static_cast<uint32_t>(di), 5);
  bw.put(static_cast<uint32_t>(dist - kDistBase[di]), kDistExtra[di]);
}

void put_chunk(std::vector<uint8_t> &png, const char *type, const std::vector<uint8_t> &data) {
  auto be32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) png.push_back(static_cast<uint8_t>(v >> s));
  };
  be32(static_cast<uint32_t>(data.size()));
  const size_t start = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  be32(crc32(png.data() + start, png.size() - start));
}

// ---- drawing helpers ----

void fill_rect(Image &img, int x0, int y0, int x1, int y1, uint32_t c) {
  for (int y = std::max(0, y0); y <= std::min(img.height - 1, y1); ++y)
    for (int x = std::max(0, x0); x <= std::min(img.width - 1, x1); ++x) img.set(x, y, c);
}

struct Clip {
  int x0, y0, x1, y1;
  bool inside(int x, int y) const { return x >= x0 && x <= x1 && y >= y0 && y <= y1; }
};

void thick_line(Image &img, int xa, int ya, int xb, int yb, uint32_t c, int radius,
                const Clip &clip) {
  int dx = std::abs(xb - xa), dy = -std::abs(yb - ya);
  const int sx = xa < xb ? 1 : -1, sy = ya < yb ? 1 : -1;
  int err = dx + dy;
  for (int guard = 0; guard < 100000; ++guard) {
    for (int oy = -radius; oy <= radius; ++oy)
      for (int ox = -radius; ox <= radius; ++ox)
        if (ox * ox + oy * oy <= radius * radius + radius && clip.inside(xa + ox, ya + oy))
          img.set(xa + ox, ya + oy, c);
    if (xa == xb && ya == yb) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      xa += sx;
    }
    if (e2 <= dx) {
      err += dx;
      ya += sy;
    }
  }
}

// Tick positions (in axis units: log10 of the value on a log axis) for [lo, hi].
std::vector<double> ticks_for(double lo, double hi, bool log_axis) {
  std::vector<double> t;
  if (log_axis) {
    const double span = hi - lo;
    for (int e = static_cast<int>(std::floor(lo)); e <= static_cast<int>(std::ceil(hi)); ++e) {
      for (double mult : {1.0, 2.0, 3.0, 5.0}) {
        if (mult != 1.0 && span > 2.5) continue;  // wide ranges: powers of ten only
        if (mult == 3.0 && span > 1.2) continue;  // narrow ranges: 1, 2, 3, 5 per decade
        const double v = e + std::log10(mult);
        if (v >= lo - 1e-9 && v <= hi + 1e-9) t.push_back(v);
      }
    }
    return t;
  }
  const double raw = (hi - lo) / 6.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 * step; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string tick_label(double v, bool log_axis) {
  char buf[32];
  if (log_axis) {
    const double value = std::pow(10.0, v);
    if (value >= 1e-3 && value < 1e5)
      std::snprintf(buf, sizeof buf, "%g", value);
    else
      std::snprintf(buf, sizeof buf, "%.0e", value);
  } else {
    std::snprintf(buf, sizeof buf, "%g", v);
  }
  return buf;
}

}  // namespace

Image::Image(int w, int h, uint32_t background)
    : width(w), height(h), rgb(static_cast<size_t>(w) * h * 3) {
  for (size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = static_cast<uint8_t>(background >> 16);
    rgb[i + 1] = static_cast<uint8_t>(background >> 8);
    rgb[i + 2] = static_cast<uint8_t>(background);
  }
}

void Image::set(int x, int y, uint32_t c) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  uint8_t *p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
  p[0] = static_cast<uint8_t>(c >> 16);
  p[1] = static_cast<uint8_t>(c >> 8);
  p[2] = static_cast<uint8_t>(c);
}

uint32_t Image::get(int x, int y) const {
  if (x < 0 || y < 0 || x >= width || y >= height) return 0;
  const uint8_t *p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
  return static_cast<uint32_t>(p[0]) << 16 | static_cast<uint32_t>(p[1]) << 8 | p[2];
}

int text_width(const std::string &text, int scale) {
  return text.empty() ? 0 : (static_cast<int>(text.size()) * kAdvance - 1) * scale;
}

int draw_text(Image &img, int x, int y, const std::string &text, uint32_t color, int scale,
              bool vertical) {
  int pen = 0;
  for (unsigned char ch : text) {
    const int g = (ch >= 32 && ch <= 126) ? ch - 32 : '?' - 32;
    for (int row = 0; row < kGlyphH; ++row)
      for (int col = 0; col < kGlyphW; ++col) {
        if (!((kFont[g][row] >> (kGlyphW - 1 - col)) & 1)) continue;
        for (int sy = 0; sy < scale; ++sy)
          for (int sx = 0; sx < scale; ++sx) {
            const int gx = (pen + col) * scale + sx, gy = row * scale + sy;
            if (vertical)
              img.set(x + gy, y - gx, color);  // baseline runs upwards
            else
              img.set(x + gx, y + gy, color);
          }
      }
    pen += kAdvance;
  }
  return text_width(text, scale);
}

Image render(const Chart &chart) {
  const int W = std::max(200, chart.width), H = std::max(150, chart.height);
  Image img(W, H);
  // Legend width from the longest name.
  int legend_w = 0;
  for (const Series &s : chart.series) legend_w = std::max(legend_w, text_width(s.name) + 40);
  const int left = 78, right = W - 20 - legend_w, top = chart.title.empty() ? 20 : 44,
            bottom = H - 52;
  const Clip plot{left, top, std::max(left + 10, right), bottom};

  // Data ranges in axis units.
  auto tx = [&](double v) { return chart.log_x ? std::log10(v) : v; };
  auto ty = [&](double v) { return chart.log_y ? std::log10(v) : v; };
  auto usable = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!chart.log_x || x > 0) &&
           (!chart.log_y || y > 0);
  };
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series &s : chart.series)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (usable(s.x[i], s.y[i])) {
        x0 = std::min(x0, tx(s.x[i]));
        x1 = std::max(x1, tx(s.x[i]));
        y0 = std::min(y0, ty(s.y[i]));
        y1 = std::max(y1, ty(s.y[i]));
      }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 - x0 < 1e-12) x0 -= 0.5, x1 += 0.5;
  if (y1 - y0 < 1e-12) y0 -= 0.5, y1 += 0.5;
  if (chart.log_y) {  // whole decades look better on a log axis when the range is wide
    if (y1 - y0 > 1.0) y0 = std::floor(y0), y1 = std::ceil(y1);
  } else {
    const double pad = 0.05 * (y1 - y0);
    y1 += pad;
    if (y0 < 0 || y0 - pad >= 0)
      y0 -= pad;
    else
      y0 = std::max(0.0, y0 - pad);
  }
  auto px = [&](double v) {
    return plot.x0 + static_cast<int>(std::lround((v - x0) / (x1 - x0) * (plot.x1 - plot.x0)));
  };
  auto py = [&](double v) {
    return plot.y1 - static_cast<int>(std::lround((v - y0) / (y1 - y0) * (plot.y1 - plot.y0)));
  };

  const uint32_t grid = 0xe6e6e6, axis = 0x000000, text = 0x202020;
  for (double t : ticks_for(x0, x1, chart.log_x)) {
    const int x = px(t);
    fill_rect(img, x, plot.y0, x, plot.y1, grid);
    fill_rect(img, x, plot.y1, x, plot.y1 + 5, axis);
    const std::string lab = tick_label(t, chart.log_x);
    draw_text(img, x - text_width(lab) / 2, plot.y1 + 9, lab, text);
  }
  for (double t : ticks_for(y0, y1, chart.log_y)) {
    const int y = py(t);
    fill_rect(img, plot.x0, y, plot.x1, y, grid);
    fill_rect(img, plot.x0 - 5, y, plot.x0, y, axis);
    const std::string lab = tick_label(t, chart.log_y);
    draw_text(img, plot.x0 - 8 - text_width(lab), y - 3, lab, text);
  }
  fill_rect(img, plot.x0, plot.y0, plot.x0, plot.y1, axis);
  fill_rect(img, plot.x0, plot.y1, plot.x1, plot.y1, axis);
  fill_rect(img, plot.x1, plot.y0, plot.x1, plot.y1, axis);
  fill_rect(img, plot.x0, plot.y0, plot.x1, plot.y0, axis);

  if (!chart.title.empty())
    draw_text(img, (plot.x0 + plot.x1) / 2 - text_width(chart.title, 2) / 2, 12, chart.title, text,
              2);
  if (!chart.x_label.empty())
    draw_text(img, (plot.x0 + plot.x1) / 2 - text_width(chart.x_label) / 2, H - 24, chart.x_label,
              text);
  if (!chart.y_label.empty())
    draw_text(img, 10, (plot.y0 + plot.y1) / 2 + text_width(chart.y_label) / 2, chart.y_label, text,
              1, true);

  size_t next_color = 0;
  int legend_y = plot.y0 + 6;
  for (const Series &s : chart.series) {
    const uint32_t c =
        s.color ? s.color : kPalette[next_color++ % (sizeof kPalette / sizeof kPalette[0])];
    int prev_x = 0, prev_y = 0;
    bool have_prev = false;
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!usable(s.x[i], s.y[i])) {
        have_prev = false;
        continue;
      }
      const int x = px(tx(s.x[i])), y = py(ty(s.y[i]));
      if (have_prev) thick_line(img, prev_x, prev_y, x, y, c, 1, plot);
      if (s.markers) {
        for (int oy = -3; oy <= 3; ++oy)
          for (int ox = -3; ox <= 3; ++ox)
            if (plot.inside(x + ox, y + oy)) img.set(x + ox, y + oy, c);
      }
      prev_x = x;
      prev_y = y;
      have_prev = true;
    }
    // Legend entry to the right of the plot.
    const int lx = plot.x1 + 14;
    thick_line(img, lx, legend_y + 3, lx + 22, legend_y + 3, c, 1, Clip{0, 0, W - 1, H - 1});
    draw_text(img, lx + 30, legend_y, s.name, text);
    legend_y += 16;
  }
  return img;
}

uint32_t crc32(const uint8_t *data, size_t n, uint32_t crc) {
  static uint32_t table[256];
  static const bool ready = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)ready;
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t *data, size_t n, uint32_t adler) {
  uint32_t a = adler & 0xffff, b = adler >> 16;
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, 5552);  // no overflow of b before the modulo
    for (size_t i = 0; i < chunk; ++i) {
      a += data[i];
      b += a;
    }
    a %= 65521;
    b %= 65521;
    data += chunk;
    n -= chunk;
  }
  return b << 16 | a;
}

std::vector<uint8_t> zlib_compress(const uint8_t *data, size_t n) {
  std::vector<uint8_t> out = {0x78, 0x01};  // deflate, 32K window, no dictionary, fastest
  BitWriter bw(out);
  bw.put(1, 1);  // BFINAL
  bw.put(1, 2);  // BTYPE = 01, fixed Huffman codes
  // LZ77 with one candidate per 3-byte hash: simple, and plenty for flat chart images.
  constexpr int kHashBits = 15;
  std::vector<int64_t> head(size_t{1} << kHashBits, -1);
  auto hash3 = [&](size_t i) {
    const uint32_t v = static_cast<uint32_t>(data[i]) << 16 |
                       static_cast<uint32_t>(data[i + 1]) << 8 | data[i + 2];
    return (v * 2654435761u) >> (32 - kHashBits);
  };
  size_t i = 0;
  while (i < n) {
    int best_len = 0;
    size_t best_dist = 0;
    if (i + 3 <= n) {
      const uint32_t h = hash3(i);
      const int64_t cand = head[h];
      head[h] = static_cast<int64_t>(i);
      if (cand >= 0 && i - static_cast<size_t>(cand) <= 32768) {
        const size_t c = static_cast<size_t>(cand);
        int len = 0;
        while (len < 258 && i + len < n && data[c + len] == data[i + len]) ++len;
        if (len >= 3) {
          best_len = len;
          best_dist = i - c;
        }
      }
    }
    if (best_len >= 3) {
      put_match(bw, best_len, static_cast<int>(best_dist));
      for (size_t k = i + 1; k < i + best_len && k + 3 <= n; ++k)
        head[hash3(k)] = static_cast<int64_t>(k);
      i += best_len;
    } else {
      put_literal(bw, data[i]);
      ++i;
    }
  }
  put_literal(bw, 256);  // end of block
  bw.flush();
  const uint32_t ad = adler32(data, n);
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(ad >> s));
  return out;
}

std::vector<uint8_t> encode_png(const Image &img) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr(13);
  auto be32 = [](uint8_t *p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 24);
    p[1] = static_cast<uint8_t>(v >> 16);
    p[2] = static_cast<uint8_t>(v >> 8);
    p[3] = static_cast<uint8_t>(v);
  };
  be32(&ihdr[0], static_cast<uint32_t>(img.width));
  be32(&ihdr[4], static_cast<uint32_t>(img.height));
  ihdr[8] = 8;   // bit depth
  ihdr[9] = 2;   // truecolor RGB
  ihdr[10] = 0;  // deflate
  ihdr[11] = 0;  // adaptive filtering (we use filter type 0 on every row)
  ihdr[12] = 0;  // no interlace
  put_chunk(png, "IHDR", ihdr);
  const size_t row = static_cast<size_t>(img.width) * 3;
  std::vector<uint8_t> raw;
  raw.reserve((row + 1) * img.height);
  for (int y = 0; y < img.height; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), img.rgb.begin() + y * row, img.rgb.begin() + (y + 1) * row);
  }
  put_chunk(png, "IDAT", zlib_compress(raw.data(), raw.size()));
  put_chunk(png, "IEND", {});
  return png;
}

bool write_png(const std::string &path, const Chart &chart, std::string *error) {
  const std::vector<uint8_t> png = encode_png(render(chart));
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f) {
    if (error) *error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  const bool ok = std::fwrite(png.data(), 1, png.size(), f) == png.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    if (error) *error = "cannot write " + path;
    return false;
  }
  return true;
}

}  // namespace pngchart
