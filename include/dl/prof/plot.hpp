#pragma once
// Line plots as standalone SVG files (no dependencies; any browser shows them): training curves
// beside a checkpoint, so a user can look at a run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../core/error.hpp"

namespace dl::prof {

struct series {
    std::string name;
    std::vector<double> values;  ///< y at x = 1, 2, 3, ... (epochs)
};

namespace detail {
/// Text made safe inside SVG (XML) elements.
inline std::string xml_text(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '<') out += "&lt;";
        else if (c == '>') out += "&gt;";
        else if (c == '&') out += "&amp;";
        else out += c;
    }
    return out;
}
}  // namespace detail

/// Writes one panel per group of series (e.g. {loss} and {train accuracy, test accuracy}), x from 1
/// to the longest series, each panel scaled to its own data.
inline void write_svg_plot(const std::filesystem::path& path, const std::string& title,
                           const std::vector<std::vector<series>>& panels) {
    constexpr int panel_w = 420, panel_h = 260, margin = 48;
    const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
    const int width = static_cast<int>(panels.size()) * (panel_w + margin) + margin, height = panel_h + 2 * margin + 20;
    std::string svg;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
                  "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                  width, height);
    svg += buf;
    svg += "<text x=\"" + std::to_string(margin) + "\" y=\"20\" font-size=\"15\">" + detail::xml_text(title) + "</text>\n";
    for (std::size_t p = 0; p < panels.size(); ++p) {
        const int x0 = margin + static_cast<int>(p) * (panel_w + margin), y0 = margin;
        double lo = INFINITY, hi = -INFINITY;
        std::size_t n = 0;
        for (const auto& s : panels[p]) {
            n = std::max(n, s.values.size());
            for (double v : s.values)
                if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
        }
        if (!(lo <= hi)) lo = 0, hi = 1;
        if (hi - lo < 1e-12) lo -= 0.5, hi += 0.5;
        const double pad = (hi - lo) * 0.05;
        lo -= pad, hi += pad;
        auto px = [&](std::size_t i) { return x0 + (n > 1 ? double(i) / double(n - 1) : 0.5) * panel_w; };
        auto py = [&](double v) { return y0 + (hi - v) / (hi - lo) * panel_h; };
        std::snprintf(buf, sizeof buf, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n",
                      x0, y0, panel_w, panel_h);
        svg += buf;
        for (int t = 0; t <= 4; ++t) {  // y ticks
            const double v = lo + (hi - lo) * t / 4;
            std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", x0 - 4, py(v) + 4, v);
            svg += buf;
        }
        std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">epoch (1 to %zu)</text>\n",
                      x0 + panel_w / 2, y0 + panel_h + 18, n);
        svg += buf;
        for (std::size_t k = 0; k < panels[p].size(); ++k) {
            const auto& s = panels[p][k];
            const char* colour = colours[k % 5];
            std::string points;
            for (std::size_t i = 0; i < s.values.size(); ++i) {
                std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(i), py(s.values[i]));
                points += buf;
            }
            svg += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + std::string(colour) + "\" points=\"" + points + "\"/>\n";
            std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" fill=\"%s\">", x0 + 8, y0 + 16 + 14 * static_cast<int>(k), colour);
            svg += buf + detail::xml_text(s.name) + "</text>\n";
        }
    }
    svg += "</svg>\n";
    std::ofstream out(path);
    if (!(out << svg)) dl::detail::fail("dl::prof: cannot write plot ", path.string());
}

}  // namespace dl::prof
