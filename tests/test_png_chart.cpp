// Tests of the `specinfer` tool's line charts (tools/chart, used by sketch-eval and bench charts):
// a chart is rendered, written with libpng and read back with libpng's own reader, then checked
// for its size, the plot frame where render() says it is, the data line through the points it
// joins, the series colours and the legend; and the errors for a path that cannot be written.
#include <png.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../tools/chart/png_chart.h"

#include "support/cmocka_setup.h"

namespace {

// A PNG read back with libpng's simplified reader as 8-bit RGB.
struct ReadBack {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  std::string error;
  uint32_t at(int x, int y) const {
    const uint8_t *p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
    return static_cast<uint32_t>(p[0]) << 16 | static_cast<uint32_t>(p[1]) << 8 | p[2];
  }
};

bool read_png(const std::string &path, ReadBack *out) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    out->error = image.message;
    return false;
  }
  image.format = PNG_FORMAT_RGB;
  out->width = static_cast<int>(image.width);
  out->height = static_cast<int>(image.height);
  out->rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, out->rgb.data(), 0, nullptr)) {
    out->error = image.message;
    png_image_free(&image);
    return false;
  }
  return true;
}

// A fresh path in the temporary directory (removed by the caller).
std::string temp_png(const char *stem) {
  const char *dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/" + stem + "-" + std::to_string(getpid()) +
         ".png";
}

size_t count_color(const ReadBack &img, uint32_t c, int x0, int y0, int x1, int y1) {
  size_t n = 0;
  for (int y = y0; y <= y1; ++y)
    for (int x = x0; x <= x1; ++x) n += img.at(x, y) == c;
  return n;
}

// True if a pixel of colour c lies within `r` pixels of (x, y).
bool near(const ReadBack &img, int x, int y, uint32_t c, int r) {
  return count_color(img, c, x - r, y - r, x + r, y + r) > 0;
}

constexpr uint32_t kOne = 0x123456, kTwo = 0xc04020, kAxis = 0x000000, kWhite = 0xffffff;

void test_chart_written_and_read_back(void **) {
  pngchart::Chart chart;
  chart.title = "Error vs storage";
  chart.x_label = "storage";
  chart.y_label = "error";
  chart.log_y = true;  // 1 .. 100: two whole decades, no padding
  chart.width = 400;
  chart.height = 300;
  // "one" rises from the lower left corner to the upper right one through the centre (10).
  chart.series.push_back({"one", {1, 5.5, 10}, {1, 10, 100}, kOne, true});
  // "two" has unusable points (negative on a log axis, NaN) that are skipped, no markers.
  chart.series.push_back({"two", {1, 4, 7, 10}, {100, -1.0, NAN, 1}, kTwo, false});
  pngchart::PlotArea area;
  const pngchart::Image img = pngchart::render(chart, &area);
  assert_true(area.x0 < area.x1 && area.y0 < area.y1);
  assert_true(area.x1 < chart.width && area.y1 < chart.height);

  const std::string path = temp_png("specinfer-chart");
  std::string err;
  assert_true(pngchart::write_png(path, chart, &err));
  assert_true(err.empty());
  ReadBack png;
  const bool read = read_png(path, &png);
  std::remove(path.c_str());
  if (!read) print_error("libpng cannot read the chart back: %s\n", png.error.c_str());
  assert_true(read);
  assert_int_equal(png.width, 400);
  assert_int_equal(png.height, 300);
  // The file holds exactly the rendered pixels.
  assert_true(png.rgb == img.rgb);

  // The frame: black along the four sides of the plot area (but near the corners, where the
  // markers of "one" cover it); white background outside it.
  for (int y = area.y0 + 5; y <= area.y1 - 5; ++y) {
    assert_int_equal(png.at(area.x0, y), kAxis);
    assert_int_equal(png.at(area.x1, y), kAxis);
  }
  for (int x = area.x0 + 5; x <= area.x1 - 5; ++x) {
    assert_int_equal(png.at(x, area.y0), kAxis);
    assert_int_equal(png.at(x, area.y1), kAxis);
  }
  assert_int_equal(png.at(1, 1), kWhite);
  assert_int_equal(png.at(png.width - 2, png.height - 2), kWhite);
  // Tick marks below the x axis and left of the y axis.
  assert_true(count_color(png, kAxis, area.x0, area.y1 + 1, area.x1, area.y1 + 5) > 0);
  assert_true(count_color(png, kAxis, area.x0 - 5, area.y0, area.x0 - 1, area.y1) > 0);

  // Series "one": a marker on its middle point, at the centre of the plot; the line passes a
  // quarter of the way along (the log axis makes it straight); the end points sit in the corners.
  const int cx = (area.x0 + area.x1) / 2, cy = (area.y0 + area.y1) / 2;
  assert_int_equal(png.at(cx, cy), kOne);
  assert_true(near(png, (3 * area.x0 + area.x1) / 4, (area.y0 + 3 * area.y1) / 4, kOne, 2));
  assert_true(near(png, area.x0 + 2, area.y1 - 2, kOne, 1));
  assert_true(near(png, area.x1 - 2, area.y0 + 2, kOne, 1));
  // Series "two": from (1, 100) to (10, 1) with its bad points skipped, so no line at all, only
  // the legend swatch (it has no markers); the top left corner is left alone.
  assert_false(near(png, area.x0 + 3, area.y0 + 3, kTwo, 2));
  assert_false(near(png, cx, cy, kTwo, 3));
  // The legend, right of the plot: one swatch per series, in the series' colour.
  assert_true(count_color(png, kOne, area.x1 + 1, 0, png.width - 1, png.height - 1) >= 22);
  assert_true(count_color(png, kTwo, area.x1 + 1, 0, png.width - 1, png.height - 1) >= 22);
  // Nothing of either colour outside the plot and the legend (text is dark grey).
  assert_int_equal(count_color(png, kOne, 0, 0, area.x0 - 1, png.height - 1), 0);
  assert_int_equal(count_color(png, kTwo, 0, 0, area.x0 - 1, png.height - 1), 0);
}

void test_text_and_degenerate_charts(void **) {
  // Text draws pixels and has the promised width.
  pngchart::Image t(100, 20);
  const int w = pngchart::draw_text(t, 1, 1, "Ab1", 0x000000);
  assert_int_equal(w, pngchart::text_width("Ab1"));
  assert_int_equal(w, 17);
  size_t dark = 0;
  for (int y = 0; y < t.height; ++y)
    for (int x = 0; x < t.width; ++x) dark += t.get(x, y) == 0x000000;
  assert_true(dark > 10);
  t.set(-1, 100, 0x00ff00);  // outside: ignored
  assert_int_equal(t.get(-1, 100), 0u);

  // Degenerate charts render without trouble.
  pngchart::Chart empty;
  empty.width = 10;  // raised to the minimum
  assert_int_equal(pngchart::render(empty).width, 200);
  pngchart::Chart flat;
  flat.log_x = true;
  flat.series.push_back({"flat", {5, 5}, {3, 3}, 0, true});
  pngchart::PlotArea area;
  const pngchart::Image img = pngchart::render(flat, &area);
  // The palette's first colour, at the centre: one point in the middle of a padded range.
  assert_int_equal(img.get((area.x0 + area.x1) / 2, (area.y0 + area.y1) / 2), 0x1f77b4u);
}

void test_unwritable_path(void **) {
  pngchart::Chart chart;
  chart.series.push_back({"one", {1, 2}, {1, 2}, 0, true});
  std::string err;
  assert_false(pngchart::write_png("/nonexistent-dir/x.png", chart, &err));
  // The message names the path and the reason.
  if (err.find("/nonexistent-dir/x.png") == std::string::npos ||
      err.find("No such file or directory") == std::string::npos) {
    print_error("unexpected message: %s\n", err.c_str());
    fail();
  }
  // An image without pixels is refused before libpng sees it.
  err.clear();
  assert_false(pngchart::write_png(temp_png("specinfer-empty"), pngchart::Image(), &err));
  assert_true(err.find("no pixels") != std::string::npos);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chart_written_and_read_back),
      cmocka_unit_test(test_text_and_degenerate_charts),
      cmocka_unit_test(test_unwritable_path),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
