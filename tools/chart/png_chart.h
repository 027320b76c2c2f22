// Line charts for the `specinfer` tool (sketch-eval, bench charts): named series of (x, y) points,
// axis labels, optional log scales, ticks, grid, legend and a 5x7 bitmap font, drawn into an 8-bit
// RGB raster and written as PNG by libpng.
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

// Where render() put the plot: the frame's left and right columns x0 < x1, its top and bottom
// rows y0 < y1. The lowest x (y) of the data sits on column x0 (row y1), the highest x on x1; on a
// log y axis that spans more than a decade, y0 and y1 are whole decades.
struct PlotArea {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// Draws the chart; fills *area if it is given.
Image render(const Chart &chart, PlotArea *area = nullptr);

// Draws `text` with the 5x7 font at (x, y) = its top-left corner, `scale` pixels per font pixel;
// `vertical` turns it 90 degrees counter-clockwise (reading bottom to top). Returns the width.
int draw_text(Image &img, int x, int y, const std::string &text, uint32_t color, int scale = 1,
              bool vertical = false);
int text_width(const std::string &text, int scale = 1);

// Writes `img` to `path` as an 8-bit RGB PNG. On failure returns false and sets *error (if given)
// to a message that names the path and the reason.
bool write_png(const std::string &path, const Image &img, std::string *error);
// Renders `chart` and writes it as above.
bool write_png(const std::string &path, const Chart &chart, std::string *error);

}  // namespace pngchart
