// Minimal line charts as inline SVG, so that HTML reports need no script and no network.
#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

struct ChartSeries {
  std::string name;
  std::string color;           // CSS colour
  std::vector<double> values;  // one per x label
};

struct LineChart {
  std::string title;
  std::string x_title;
  std::string y_title;
  std::vector<std::string> x_labels;  // evenly spaced categories (the levels)
  std::vector<ChartSeries> series;
};

std::string render_line_chart_svg(const LineChart& chart);
// Escapes &, <, >, " for HTML and SVG text.
std::string escape_html(const std::string& text);

}  // namespace tessera::bench
