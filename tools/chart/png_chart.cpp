// Line charts drawn into an RGB raster and written as PNG by libpng (see png_chart.h).
#include "png_chart.h"

#include <png.h>

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

Image render(const Chart &chart, PlotArea *area) {
  const int W = std::max(200, chart.width), H = std::max(150, chart.height);
  Image img(W, H);
  // Legend width from the longest name.
  int legend_w = 0;
  for (const Series &s : chart.series) legend_w = std::max(legend_w, text_width(s.name) + 40);
  const int left = 78, right = W - 20 - legend_w, top = chart.title.empty() ? 20 : 44,
            bottom = H - 52;
  const Clip plot{left, top, std::max(left + 10, right), bottom};
  if (area) *area = {plot.x0, plot.y0, plot.x1, plot.y1};

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

bool write_png(const std::string &path, const Image &img, std::string *error) {
  if (img.width <= 0 || img.height <= 0 ||
      img.rgb.size() != static_cast<size_t>(img.width) * img.height * 3) {
    if (error) *error = "cannot write " + path + ": the image has no pixels or a wrong size";
    return false;
  }
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(img.width);
  image.height = static_cast<png_uint_32>(img.height);
  image.format = PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&image, path.c_str(), 0, img.rgb.data(), img.width * 3, nullptr)) {
    if (error) *error = "cannot write " + path + ": " + image.message;
    png_image_free(&image);
    return false;
  }
  return true;
}

bool write_png(const std::string &path, const Chart &chart, std::string *error) {
  return write_png(path, render(chart), error);
}

}  // namespace pngchart
