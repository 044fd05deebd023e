// The profiler: it sees the ops a Context runs (forward and backward), counts FLOPs from their
// definitions, charges self time, writes a Chrome trace that parses, and records nothing detached.
#include "support.hpp"

#include <dl/data.hpp>
#include <dl/prof/profiler.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace {
const dl::prof::op_summary* find(const std::vector<dl::prof::op_summary>& rows, std::string_view name) {
    for (const auto& r : rows)
        if (r.name == name) return &r;
    return nullptr;
}
}  // namespace

TEST_CASE("the profiler records forward and backward ops with FLOPs and self time") {
    dl::Context ctx({.seed = 1, .threads = 1});
    dl::prof::profiler p;
    const auto a = dl::normal<float>({8, 16}, 0, 1, ctx), b = dl::normal<float>({16, 4}, 0, 1, ctx);
    {
        const auto before = dl::matmul(a, b);  // not attached yet
        (void)before;
    }
    ctx.set_profiler(&p);
    CHECK(ctx.profiler() == &p);
    dl::Tensor<float> w = b.clone().requires_grad_();
    dl::Tensor<float> y = dl::tanh(dl::matmul(a, w)) * 2.0f;
    dl::sum(y).backward();
    const auto x = dl::normal<float>({2, 1, 6, 6}, 0, 1, ctx);
    const auto k = dl::normal<float>({3, 1, 3, 3}, 0, 1, ctx);
    (void)dl::max_pool2d(dl::conv2d(x, k), {.kernel = 2});
    ctx.set_profiler(nullptr);
    (void)dl::matmul(a, b);  // detached again: not recorded

    const auto rows = p.summary();
    const auto* mm = find(rows, "matmul");
    REQUIRE(mm);
    CHECK(mm->calls == 1 + 1 + 2);  // forward, the weight gradient, and the conv's two images
    CHECK(mm->flops == doctest::Approx(2.0 * 8 * 16 * 4 * 2 + 2.0 * 3 * 9 * 16 * 2));
    CHECK(find(rows, "fused elementwise"));  // tanh(...) * 2: one loop
    CHECK(find(rows, "backward"));
    CHECK(find(rows, "conv2d"));
    CHECK(find(rows, "max_pool2d"));
    double self = 0;
    for (const auto& e : p.events()) {
        CHECK(e.self_ns <= e.duration_ns);
        CHECK(e.self_ns >= 0);
        if (e.depth == 0) self += static_cast<double>(e.duration_ns);
    }
    double total_self = 0;
    for (const auto& r : rows) total_self += r.self_seconds * 1e9;
    CHECK(total_self == doctest::Approx(self).epsilon(1e-9));  // self times add up to the top-level time
    const std::string table = p.table();
    CHECK(table.find("GFLOP/s") != std::string::npos);
    CHECK(table.find("matmul") != std::string::npos);

    const auto path = std::filesystem::temp_directory_path() / ("dl_test_trace_" + std::to_string(::getpid()) + ".json");
    p.write_chrome_trace(path);
    std::ifstream in(path);
    const auto trace = nlohmann::json::parse(in);
    REQUIRE(trace["traceEvents"].is_array());
    CHECK(trace["traceEvents"].size() == p.events().size());
    CHECK(trace["traceEvents"][0]["ph"] == "X");
    CHECK(trace["traceEvents"][0].contains("dur"));
    std::filesystem::remove(path);
    p.clear();
    CHECK(p.events().empty());
}

TEST_CASE("nested scopes charge self time; the parameter table counts every parameter") {
    dl::Context ctx({.threads = 1});
    dl::prof::profiler p;
    ctx.set_profiler(&p);
    {
        dl::op_scope outer(ctx, "outer");
        {
            dl::op_scope inner(ctx, "inner", 100, 10);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    const auto events = p.events();
    REQUIRE(events.size() == 2);
    CHECK(std::string(events[0].name) == "inner");
    CHECK(events[0].depth == 1);
    CHECK(events[1].self_ns == events[1].duration_ns - events[0].duration_ns);
    CHECK(events[0].flops == 100);

    dl::nn::sequential model{dl::nn::linear<float>(3, 4, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(4, 2, false, ctx)};
    const std::string table = dl::prof::parameter_table(model);
    CHECK(table.find("0.weight") != std::string::npos);
    CHECK(table.find("[4, 3]") != std::string::npos);
    CHECK(table.find("2.weight") != std::string::npos);
    CHECK(table.find("24") != std::string::npos);  // 12 + 4 + 8
}
