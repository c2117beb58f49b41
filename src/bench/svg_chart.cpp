#include "bench/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tessera::bench {
namespace {

constexpr double kWidth = 560, kHeight = 320;
constexpr double kLeft = 64, kRight = 150, kTop = 36, kBottom = 48;

// A round step giving about five grid lines up to `max`.
double nice_step(double max) {
  if (max <= 0) return 1;
  double raw = max / 5;
  double magnitude = std::pow(10, std::floor(std::log10(raw)));
  for (double factor : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (raw <= factor * magnitude) return factor * magnitude;
  return 10 * magnitude;
}

std::string format_tick(double value) {
  if (value == 0) return "0";
  if (std::abs(value) >= 10 || value == std::round(value)) return fmt::format("{:.0f}", value);
  return fmt::format("{:.3g}", value);
}

}  // namespace

std::string escape_html(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_line_chart_svg(const LineChart& chart) {
  double max_value = 0;
  for (const ChartSeries& s : chart.series)
    for (double v : s.values)
      if (std::isfinite(v)) max_value = std::max(max_value, v);
  double step = nice_step(max_value);
  double y_max = std::max(step, std::ceil(max_value / step) * step);
  double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  size_t n = chart.x_labels.size();
  auto x_of = [&](size_t i) { return kLeft + (n <= 1 ? plot_w / 2 : plot_w * static_cast<double>(i) / (n - 1)); };
  auto y_of = [&](double v) { return kTop + plot_h * (1 - v / y_max); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" "
      "role=\"img\" aria-label=\"{2}\">\n",
      kWidth, kHeight, escape_html(chart.title));
  svg += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", kWidth, kHeight);
  svg += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"bold\" fill=\"#222\">{}</text>\n", kLeft,
                     escape_html(chart.title));
  for (double tick = 0; tick <= y_max + step / 2; tick += step) {
    double y = y_of(tick);
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e3e3e3\"/>\n", kLeft, y,
                       kLeft + plot_w, y);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">{}</text>\n",
                       kLeft - 6, y + 4, format_tick(tick));
  }
  svg +=
      fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#888\"/>\n", kLeft, kTop, kTop + plot_h);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#888\"/>\n", kLeft, kTop + plot_h,
                     kLeft + plot_w);
  for (size_t i = 0; i < n; ++i)
    svg +=
        fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">{}</text>\n",
                    x_of(i), kTop + plot_h + 16, escape_html(chart.x_labels[i]));
  svg +=
      fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#333\">{}</text>\n",
                  kLeft + plot_w / 2, kHeight - 8, escape_html(chart.x_title));
  svg += fmt::format(
      "<text x=\"14\" y=\"{0:.1f}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#333\" "
      "transform=\"rotate(-90 14 {0:.1f})\">{1}</text>\n",
      kTop + plot_h / 2, escape_html(chart.y_title));
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const ChartSeries& series = chart.series[s];
    std::string points;
    for (size_t i = 0; i < std::min(n, series.values.size()); ++i) {
      if (!std::isfinite(series.values[i])) continue;
      points += fmt::format("{:.1f},{:.1f} ", x_of(i), y_of(series.values[i]));
    }
    svg +=
        fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n", series.color, points);
    for (size_t i = 0; i < std::min(n, series.values.size()); ++i) {
      if (!std::isfinite(series.values[i])) continue;
      svg += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{} at {}: {:.4g}</title></circle>\n",
          x_of(i), y_of(series.values[i]), series.color, escape_html(series.name), escape_html(chart.x_labels[i]),
          series.values[i]);
    }
    double legend_y = kTop + 8 + 18 * static_cast<double>(s);
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"4\" fill=\"{}\"/>\n",
                       kWidth - kRight + 14, legend_y - 4, series.color);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#333\">{}</text>\n",
                       kWidth - kRight + 34, legend_y + 1, escape_html(series.name));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace tessera::bench
