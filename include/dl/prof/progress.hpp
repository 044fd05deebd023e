#pragma once
// Progress of long-running work: on a terminal, one line redrawn in place (a bar, step/total, the
// caller's metrics, rate and ETA); elsewhere (CI logs, pipes) a plain line every `log_every` seconds
// and at the end, so logs stay readable.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dl::prof {

struct progress_options {
    std::string unit = "samples";  ///< what the rate counts
    double redraw_seconds = 0.1;   ///< terminal: the shortest time between redraws
    double log_every = 10;         ///< not a terminal: seconds between plain lines
    int width = 30;                ///< characters of the bar
};

class progress_bar {
public:
    /// `total` steps of `per_step` units each (e.g. batches of 64 samples); `out` is a terminal when
    /// `terminal` says so (default: whether stdout is one).
    progress_bar(std::string label, std::int64_t total, std::int64_t per_step = 1, std::ostream& out = std::cout,
                 progress_options options = {}, bool terminal = ::isatty(STDOUT_FILENO) != 0)
        : label_(std::move(label)), total_(total), per_step_(per_step), out_(out), o_(std::move(options)),
          terminal_(terminal), start_(clock::now()), last_draw_(start_) {}

    /// Reports that `done` steps are finished, with the metrics to show (name, value).
    void update(std::int64_t done, const std::vector<std::pair<std::string, double>>& metrics = {},
                std::int64_t units = -1) {
        done_ = done;
        units_ = units >= 0 ? units : done * per_step_;
        metrics_ = metrics;
        const auto now = clock::now();
        const double since = seconds(last_draw_, now);
        if (done < total_ && since < (terminal_ ? o_.redraw_seconds : o_.log_every)) return;
        last_draw_ = now;
        draw(done >= total_);
    }
    /// Draws the final state (once) and ends the line.
    void finish() {
        if (finished_) return;
        finished_ = true;
        draw(true);
    }
    ~progress_bar() { finish(); }

    [[nodiscard]] double elapsed_seconds() const { return seconds(start_, clock::now()); }
    /// The line as it would be drawn now (for logs and tests).
    [[nodiscard]] std::string line() const {
        std::ostringstream s;
        const double elapsed = elapsed_seconds();
        const double fraction = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
        s << label_ << ' ';
        if (terminal_) {
            const int filled = static_cast<int>(fraction * o_.width);
            s << '[' << std::string(static_cast<std::size_t>(filled), '=')
              << (filled < o_.width ? ">" : "") << std::string(static_cast<std::size_t>(std::max(0, o_.width - filled - 1)), ' ')
              << "] ";
        }
        s << done_ << '/' << total_;
        char buffer[64];
        for (const auto& [name, value] : metrics_) {
            std::snprintf(buffer, sizeof buffer, " %.4g", value);
            s << ' ' << name << buffer;
        }
        const double rate = elapsed > 0 ? static_cast<double>(units_) / elapsed : 0;
        std::snprintf(buffer, sizeof buffer, " | %.0f %s/s", rate, o_.unit.c_str());
        s << buffer;
        if (done_ < total_ && done_ > 0)
            s << " | ETA " << clock_text(elapsed / static_cast<double>(done_) * static_cast<double>(total_ - done_));
        else
            s << " | " << clock_text(elapsed);
        return s.str();
    }

private:
    using clock = std::chrono::steady_clock;
    static double seconds(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
    static std::string clock_text(double seconds) {
        const auto s = static_cast<long>(seconds + 0.5);
        char buffer[32];
        if (s >= 3600)
            std::snprintf(buffer, sizeof buffer, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
        else
            std::snprintf(buffer, sizeof buffer, "%ld:%02ld", s / 60, s % 60);
        return buffer;
    }
    void draw(bool final_line) {
        if (terminal_)
            out_ << '\r' << line() << "\033[K" << (final_line ? "\n" : "") << std::flush;
        else
            out_ << line() << '\n' << std::flush;
        if (final_line) finished_ = true;
    }

    std::string label_;
    std::int64_t total_, per_step_, done_ = 0, units_ = 0;
    std::ostream& out_;
    progress_options o_;
    bool terminal_, finished_ = false;
    clock::time_point start_, last_draw_;
    std::vector<std::pair<std::string, double>> metrics_;
};

}  // namespace dl::prof
