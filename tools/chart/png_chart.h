// A small, dependency-free line-chart renderer and PNG writer for the `specinfer` tool
// (sketch-eval, bench charts). Charts: named series of (x, y) points, axis labels, optional
// log scales, ticks, grid, legend and a 5x7 bitmap font. PNG: 8-bit RGB, one zlib stream of
// fixed-Huffman deflate with a simple LZ77 matcher, CRC-32 and Adler-32 computed here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pngchart {

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; points with non-finite (or, on a log axis,
                             // non-positive) coordinates are skipped
  uint32_t color = 0;        // 0xRRGGBB; 0 picks the next color of the palette
  bool markers = true;       // a small square at every point
};

struct Chart {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  int width = 900, height = 560;  // pixels (at least 200 x 150)
  std::vector<Series> series;
};

// An 8-bit RGB raster, rows top to bottom.
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  Image() = default;
  Image(int w, int h, uint32_t background = 0xffffff);
  void set(int x, int y, uint32_t color);  // ignores pixels outside the image
  uint32_t get(int x, int y) const;
};

// Draws the chart.
Image render(const Chart &chart);

// Draws `text` with the 5x7 font at (x, y) = its top-left corner, `scale` pixels per font pixel;
// `vertical` turns it 90 degrees counter-clockwise (reading bottom to top). Returns the width.
int draw_text(Image &img, int x, int y, const std::string &text, uint32_t color, int scale = 1,
              bool vertical = false);
int text_width(const std::string &text, int scale = 1);

// Encodes an image as PNG bytes.
std::vector<uint8_t> encode_png(const Image &img);
// Renders and writes `chart` to `path`. On failure returns false and sets *error.
bool write_png(const std::string &path, const Chart &chart, std::string *error);

// The checksums and the compressor, exposed for tests.
uint32_t crc32(const uint8_t *data, size_t n, uint32_t crc = 0);
uint32_t adler32(const uint8_t *data, size_t n, uint32_t adler = 1);
std::vector<uint8_t> zlib_compress(const uint8_t *data, size_t n);

}  // namespace pngchart
