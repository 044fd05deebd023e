// The fused_codegen pass: a fused node's chain compiled into one loop gives the interpreted steps'
// results bit for bit (odd tails, one element, a broadcast input, scalar operands on either side,
// functor parameters, two threads, an output past the last-level cache); kernels are cached on disk
// and a corrupt one is rebuilt; a node that cannot be compiled, or a compiler that fails, leaves the
// steps running with a reason.
// ctest sets DL_CXX to the compiler that built this test.
#include "support.hpp"

#include <dl/graph/codegen.hpp>
#include <dl/graph/trace.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <tuple>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace {

using dl::Tensor;
namespace graph = dl::graph;

/// A fresh cache directory, removed at the end of the test.
struct scratch_cache {
    std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                ("dl-codegen-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    scratch_cache() { std::filesystem::remove_all(dir); }
    ~scratch_cache() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    static int& counter() {
        static int n = 0;
        return n;
    }
    [[nodiscard]] std::size_t libraries() const {
        std::size_t n = 0;
        if (!std::filesystem::exists(dir)) return n;
        for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.path().extension() == ".so";
        return n;
    }
};

/// Same shape and the same bits in every element, except that any NaN matches any NaN: which
/// operand's NaN an instruction passes on depends on the order the compiler put commutative operands in.
bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
    if (a.shape() != b.shape() || !a.is_contiguous() || !b.is_contiguous()) return false;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        const float x = a.data()[i], y = b.data()[i];
        if (std::bit_cast<std::uint32_t>(x) != std::bit_cast<std::uint32_t>(y) && !(std::isnan(x) && std::isnan(y))) return false;
    }
    return true;
}

const graph::node& fused_node(const graph::Graph& g) {
    for (const auto& n : g.nodes)
        if (n.fused()) return n;
    FAIL("no fused node in\n" << g.to_string());
    return g.nodes.front();
}

Tensor<float> benchmark_chain(const Tensor<float>& x, const Tensor<float>& y, const Tensor<float>& z) {
    Tensor<float> scaled = x * 1.5f;
    Tensor<float> shifted = scaled + y;
    Tensor<float> gate = dl::sigmoid(shifted);
    Tensor<float> gated = gate * z;
    Tensor<float> t = dl::tanh(x);
    return gated - t;
}

}  // namespace

TEST_CASE("fused_codegen: the benchmark chain compiles and equals the interpreted steps bit for bit") {
    const scratch_cache cache;
    for (const int threads : {1, 2}) {
        dl::Context ctx({.seed = 5, .threads = threads});
        auto inputs = [&](std::int64_t n) {
            auto x = dl::uniform<float>({n}, -4, 4, ctx);
            if (n > 2) {  // special values through both paths
                x.data()[0] = std::numeric_limits<float>::quiet_NaN();
                x.data()[1] = -std::numeric_limits<float>::infinity();
            }
            return std::tuple{x, dl::uniform<float>({n}, -4, 4, ctx), dl::uniform<float>({n}, -4, 4, ctx)};
        };
        const auto [x, y, z] = inputs(4099);
        auto interpreted = graph::trace(benchmark_chain, x, y, z);
        interpreted.optimize();
        auto compiled = graph::trace(benchmark_chain, x, y, z);
        auto passes = graph::default_passes();
        passes.add(graph::fused_codegen({.cache_dir = cache.dir}));
        compiled.optimize(passes);
        INFO(compiled.graph().to_string());
        REQUIRE(fused_node(compiled.graph()).compiled);
        CHECK_FALSE(fused_node(interpreted.graph()).compiled);
        CHECK(compiled.graph().to_string().find("# compiled") != std::string::npos);
        // The batch dimension varies; the last size's output is larger than the last-level cache and
        // takes streaming stores.
        const std::int64_t beyond_cache = dl::detail::last_level_cache_bytes() / 4 + 17;
        for (const std::int64_t n : {std::int64_t{4099}, std::int64_t{1}, std::int64_t{15}, std::int64_t{16},
                                     std::int64_t{17}, std::int64_t{1025}, std::int64_t{70001}, beyond_cache}) {
            CAPTURE(n);
            const auto [a, b, c] = inputs(n);
            CHECK(same_bits(compiled(a, b, c), interpreted(a, b, c)));
        }
    }
    CHECK(cache.libraries() == 1);  // the second thread count found the first one's kernel
}

TEST_CASE("fused_codegen: scalars on either side, functor parameters and a broadcast input") {
    const scratch_cache cache;
    dl::Context ctx({.seed = 6, .threads = 2});
    const auto a = dl::uniform<float>({3, 1001}, -3, 3, ctx);
    const auto one = dl::uniform<float>({1}, 0.5, 2, ctx);  // single element: broadcast inside the node
    auto body = [](const Tensor<float>& x, const Tensor<float>& s) {
        Tensor<float> flipped = 2.0f - x;                          // scalar on the left (s0)
        Tensor<float> leaky = dl::leaky_relu(flipped, 0.2);        // a functor parameter
        Tensor<float> scaled = leaky * s;                          // the broadcast input
        Tensor<float> smooth = dl::elu(x, 0.7);
        return Tensor<float>(scaled + smooth / 3.0f);
    };
    auto interpreted = graph::trace(body, a, one);
    interpreted.optimize();
    auto compiled = graph::trace(body, a, one);
    auto passes = graph::default_passes();
    passes.add(graph::fused_codegen({.cache_dir = cache.dir}));
    compiled.optimize(passes);
    INFO(compiled.graph().to_string());
    REQUIRE(std::count_if(compiled.graph().nodes.begin(), compiled.graph().nodes.end(),
                          [](const graph::node& n) { return n.fused(); }) == 1);
    REQUIRE(fused_node(compiled.graph()).compiled);
    CHECK(same_bits(compiled(a, one), interpreted(a, one)));
    const auto b = dl::uniform<float>({1, 1001}, -3, 3, ctx);
    CHECK(same_bits(compiled(b, one), interpreted(b, one)));
}

TEST_CASE("fused_codegen: a kernel is built once, loaded from the cache after, and rebuilt when corrupt") {
    const scratch_cache cache;
    dl::Context ctx({.seed = 7, .threads = 1});
    const auto x = dl::uniform<float>({2048}, -2, 2, ctx);
    auto trace = [&] { return graph::trace([](const Tensor<float>& v) { return Tensor<float>(dl::exp(v * 0.5f) - v); }, x); };
    auto reference = trace();
    reference.optimize();
    const Tensor<float> expected = reference(x);
    auto first = trace();
    first.optimize();
    const graph::codegen_options options{.cache_dir = cache.dir};
    REQUIRE(graph::compile_fused(first.graph(), fused_node(first.graph()), options));
    REQUIRE(cache.libraries() == 1);
    const auto library = std::filesystem::directory_iterator(cache.dir)->path();
    const auto built = std::filesystem::last_write_time(library);
    REQUIRE(graph::compile_fused(first.graph(), fused_node(first.graph()), options));
    CHECK(std::filesystem::last_write_time(library) == built);  // loaded, not built again
    {
        std::ofstream garbage(library, std::ios::trunc);
        garbage << "not a shared object";
    }
    auto second = trace();
    auto passes = graph::default_passes();
    passes.add(graph::fused_codegen(options));
    second.optimize(passes);
    REQUIRE(fused_node(second.graph()).compiled);
    CHECK(cache.libraries() == 1);
    std::ifstream rebuilt(library, std::ios::binary);
    char magic[4] = {};
    rebuilt.read(magic, 4);
    CHECK(std::string_view(magic, 4) == "\x7f" "ELF");  // built again, not the garbage
    CHECK(same_bits(second(x), expected));
}

TEST_CASE("fused_codegen: the compiler runs for a kernel it builds, and not for a cached one") {
    const scratch_cache cache, tools;
    std::filesystem::create_directories(tools.dir);
    // A compiler that counts its runs, then runs the real one.
    const auto compiler = tools.dir / "counting-c++", runs = tools.dir / "runs";
    const char* real = std::getenv("DL_CXX");
    {
        std::ofstream script(compiler);
        script << "#!/bin/sh\necho run >> '" << runs.string() << "'\nexec '" << (real ? real : "c++") << "' \"$@\"\n";
    }
    std::filesystem::permissions(compiler, std::filesystem::perms::owner_all);
    auto count = [&] {
        std::ifstream in(runs);
        return std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
    };
    dl::Context ctx({.seed = 9, .threads = 1});
    const auto x = dl::uniform<float>({300}, -2, 2, ctx);
    auto f = graph::trace([](const Tensor<float>& v) { return Tensor<float>(dl::exp(v * 0.25f) + v); }, x);
    auto g = graph::trace([](const Tensor<float>& v) { return Tensor<float>(dl::tanh(v) * 0.5f - v); }, x);
    f.optimize();
    g.optimize();
    const graph::codegen_options options{.cache_dir = cache.dir, .compiler = compiler.string()};
    REQUIRE(graph::compile_fused(f.graph(), fused_node(f.graph()), options));
    CHECK(count() == 2);  // what the flags resolve to, then the kernel
    REQUIRE(graph::compile_fused(f.graph(), fused_node(f.graph()), options));
    CHECK(count() == 2);  // cached, and the toolchain already known
    REQUIRE(graph::compile_fused(g.graph(), fused_node(g.graph()), options));
    CHECK(count() == 3);  // another kernel
    CHECK(cache.libraries() == 2);
}

TEST_CASE("fused_codegen: a host that ignores SIGCHLD still gets its kernel, and a failing compiler's reason") {
    const scratch_cache cache;
    dl::Context ctx({.seed = 10, .threads = 1});
    const auto x = dl::uniform<float>({500}, -2, 2, ctx);
    auto chain = [](const Tensor<float>& v) { return Tensor<float>(dl::sigmoid(v * 3.0f) - v); };
    auto reference = graph::trace(chain, x);
    reference.optimize();
    auto f = graph::trace(chain, x);
    f.optimize();
    // The compiler's exit status is lost: children are reaped as they end.
    const auto previous = std::signal(SIGCHLD, SIG_IGN);
    std::string why;
    const auto built = graph::compile_fused(f.graph(), fused_node(f.graph()), {.cache_dir = cache.dir}, &why);
    const auto failed = graph::compile_fused(f.graph(), fused_node(f.graph()), {.cache_dir = cache.dir, .compiler = "false"});
    std::signal(SIGCHLD, previous);
    INFO(why);
    REQUIRE(built);
    CHECK_FALSE(failed);
    std::vector<const void*> inputs{x.data()};
    const unsigned char broadcast[1] = {0};
    Tensor<float> out({500}, ctx);
    built.run(inputs.data(), broadcast, out.data(), 500, false);
    CHECK(same_bits(out, reference(x)));
}

TEST_CASE("fused_codegen: what cannot be compiled keeps running its steps, with the reason") {
    const scratch_cache cache;
    dl::Context ctx({.seed = 8, .threads = 1});
    std::string why;
    {
        const auto d = dl::uniform<double>({100}, -1, 1, ctx);
        auto f = graph::trace([](const Tensor<double>& v) { return Tensor<double>(dl::exp(v) * 2.0); }, d);
        f.optimize();
        CHECK_FALSE(graph::compile_fused(f.graph(), fused_node(f.graph()), {.cache_dir = cache.dir}, &why));
        CHECK(why == "an input is not float32");
    }
    const auto x = dl::uniform<float>({100}, -1, 1, ctx);
    {
        auto f = graph::trace([](const Tensor<float>& v) { return Tensor<float>(dl::where(v > 0.0f, v, 0.0f) * 2.0f); }, x);
        f.optimize();
        CHECK_FALSE(graph::compile_fused(f.graph(), fused_node(f.graph()), {.cache_dir = cache.dir}, &why));
        CHECK(why.find("has no generated form") != std::string::npos);
    }
    auto chain = [](const Tensor<float>& v) { return Tensor<float>(dl::tanh(v) * 3.0f); };
    auto reference = graph::trace(chain, x);
    reference.optimize();
    auto f = graph::trace(chain, x);
    const graph::codegen_options broken{.cache_dir = cache.dir, .compiler = "/nonexistent/c++"};
    f.optimize();
    CHECK_FALSE(graph::compile_fused(f.graph(), fused_node(f.graph()), broken, &why));
    CHECK(why == "/nonexistent/c++ did not run");
    auto passes = graph::default_passes();
    passes.add(graph::fused_codegen(broken));
    auto g = graph::trace(chain, x);
    g.optimize(passes);
    CHECK_FALSE(fused_node(g.graph()).compiled);
    CHECK(same_bits(g(x), reference(x)));
    CHECK(cache.libraries() == 0);
}

TEST_CASE("fused_codegen: attributes it does not know, repeated, or not numbers are refused") {
    const scratch_cache cache;
    dl::Context ctx({.seed = 9, .threads = 1});
    const auto x = dl::uniform<float>({64}, -1, 1, ctx);
    auto f = graph::trace([](const Tensor<float>& v) { return Tensor<float>(dl::leaky_relu(v * 2.0f, 0.1)); }, x);
    f.optimize();
    graph::Graph g = f.graph();
    graph::node& n = g.nodes.back();
    REQUIRE(n.fused());
    std::string why;
    for (const char* attributes : {"slope=0.1, slope=0.5", "slope=0.1; system(\"true\")", "x=1; int y=2", "slope=1e400x"}) {
        CAPTURE(attributes);
        n.steps.back().attributes = attributes;
        CHECK_FALSE(graph::compile_fused(g, n, {.cache_dir = cache.dir}, &why));
        CHECK(why.find("has attribute") != std::string::npos);
    }
    CHECK(cache.libraries() == 0);
}

TEST_CASE("fused_codegen: a compiled node writing in place of the input it reads") {
    const scratch_cache cache;
    dl::Context ctx({.seed = 10, .threads = 2});
    const auto x = dl::uniform<float>({33, 257}, -1, 1, ctx);
    dl::nn::linear<float> fc(257, 129, true, ctx);
    // The product's result is read only by the fused chain, so memory planning lets the chain write
    // over it; the compiled loop reads each index before it stores there.
    auto body = [&](const Tensor<float>& in) {
        Tensor<float> h = fc(in);
        Tensor<float> scaled = h * 0.5f;
        return Tensor<float>(dl::tanh(scaled) - dl::sigmoid(h));
    };
    auto interpreted = graph::trace(body, x);
    interpreted.optimize();
    auto compiled = graph::trace(body, x);
    auto passes = graph::default_passes();
    passes.add(graph::fused_codegen({.cache_dir = cache.dir}));
    compiled.optimize(passes);
    INFO(compiled.graph().to_string());
    const graph::node& n = fused_node(compiled.graph());
    REQUIRE(n.compiled);
    CHECK(n.in_place >= 0);
    CHECK(same_bits(compiled(x), interpreted(x)));
    const auto wider = dl::uniform<float>({70, 257}, -1, 1, ctx);
    CHECK(same_bits(compiled(wider), interpreted(wider)));
}
