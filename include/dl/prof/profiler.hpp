#pragma once
// The op profiler. Attached to a Context (ctx.set_profiler(&p)), it records every op that Context runs
// — elementwise loops, reductions, matrix products, convolutions, pooling, and the backward of each —
// with its wall time and the FLOP and byte counts from the op's definition. It prints a summary per
// op type (calls, self time, share, GFLOP/s, GB/s) and writes a Chrome-trace timeline (open it in
// Perfetto or chrome://tracing). Ops report to it through op_scope (core/op_scope.hpp), whose times
// are self times, so the shares add up to 100%.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "../core/context.hpp"
#include "../core/error.hpp"
#include "../core/op_scope.hpp"

namespace dl::prof {

// Their home before they moved down to core/ (so that kernels below prof/ time themselves).
using dl::op_event;
using dl::op_scope;

/// Totals of one op type.
struct op_summary {
    std::string name;
    std::int64_t calls = 0;
    double self_seconds = 0, flops = 0, bytes = 0;
};

class profiler final : public op_listener {
public:
    profiler() : origin_(clock::now()) {}

    /// Adds an event (thread-safe). Ops report through op_scope; call this for your own regions.
    void record(const op_event& e) override {
        std::lock_guard lock(mutex_);
        events_.push_back(e);
    }
    [[nodiscard]] std::vector<op_event> events() const {
        std::lock_guard lock(mutex_);
        return events_;
    }
    void clear() {
        std::lock_guard lock(mutex_);
        events_.clear();
    }
    [[nodiscard]] std::int64_t now_ns() const override {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - origin_).count();
    }

    /// Per op type, largest self time first.
    [[nodiscard]] std::vector<op_summary> summary() const {
        std::map<std::string_view, op_summary> by_name;
        for (const auto& e : events()) {
            auto& s = by_name[e.name];
            s.name = e.name;
            ++s.calls;
            s.self_seconds += static_cast<double>(e.self_ns) * 1e-9;
            s.flops += e.flops;
            s.bytes += e.bytes;
        }
        std::vector<op_summary> out;
        for (auto& [name, s] : by_name) out.push_back(s);
        std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.self_seconds > b.self_seconds; });
        return out;
    }

    /// The summary as a text table.
    [[nodiscard]] std::string table() const {
        const auto rows = summary();
        double total = 0;
        for (const auto& r : rows) total += r.self_seconds;
        std::string out;
        char line[160];
        std::snprintf(line, sizeof line, "%-26s %9s %11s %7s %9s %9s\n", "op", "calls", "self ms", "%", "GFLOP/s", "GB/s");
        out += line;
        for (const auto& r : rows) {
            const double s = r.self_seconds;
            std::snprintf(line, sizeof line, "%-26s %9lld %11.3f %6.1f%% %9.2f %9.2f\n", r.name.c_str(),
                          static_cast<long long>(r.calls), s * 1e3, total > 0 ? 100 * s / total : 0.0,
                          s > 0 ? r.flops / s * 1e-9 : 0.0, s > 0 ? r.bytes / s * 1e-9 : 0.0);
            out += line;
        }
        std::snprintf(line, sizeof line, "%-26s %9s %11.3f\n", "total", "", total * 1e3);
        out += line;
        return out;
    }

    /// Writes the events as Chrome-trace JSON ("X" complete events, microseconds).
    void write_chrome_trace(const std::filesystem::path& path) const {
        std::ofstream out(path);
        if (!out) dl::detail::fail("dl::prof: cannot write trace ", path.string());
        out << "{\"traceEvents\":[\n";
        bool first = true;
        char line[320];
        for (const auto& e : events()) {
            std::snprintf(line, sizeof line,
                          "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,"
                          "\"args\":{\"flops\":%.0f,\"bytes\":%.0f}}",
                          first ? "" : ",\n", e.name, e.thread, static_cast<double>(e.start_ns) * 1e-3,
                          static_cast<double>(e.duration_ns) * 1e-3, e.flops, e.bytes);
            out << line;
            first = false;
        }
        out << "\n],\"displayTimeUnit\":\"ms\"}\n";
        if (!out) dl::detail::fail("dl::prof: writing trace ", path.string(), " failed");
    }

private:
    using clock = std::chrono::steady_clock;
    clock::time_point origin_;
    mutable std::mutex mutex_;
    std::vector<op_event> events_;
};

/// Parameters per layer of a model: "name  shape  count" lines and the total.
template <class Model>
[[nodiscard]] std::string parameter_table(Model& model) {
    std::string out;
    std::int64_t total = 0;
    char line[200];
    model.for_each_parameter([&](std::string_view name, const auto& t) {
        std::ostringstream shape;
        shape << t.shape();
        std::snprintf(line, sizeof line, "%-32.*s %-18s %12lld\n", static_cast<int>(name.size()), name.data(),
                      shape.str().c_str(), static_cast<long long>(t.numel()));
        out += line;
        total += t.numel();
    });
    std::snprintf(line, sizeof line, "%-32s %-18s %12lld\n", "total", "", static_cast<long long>(total));
    return out + line;
}

}  // namespace dl::prof
