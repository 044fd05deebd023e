// Export for serving (graph/serialize.hpp): a saved graph loads back as the same graph (text, types,
// parameters) and computes the same bits as the graph it was saved from, optimised or not, at other
// batch sizes; what cannot be saved is refused by name; corrupt and foreign files fail clearly.
#include "support.hpp"

#include <dl/dl.hpp>
#include <dl/graph/serialize.hpp>
#include <dl/nn/checkpoint.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace {

using dl::Tensor;
namespace graph = dl::graph;
using any_tensor = dl::autograd::any_tensor;

/// A file under the temporary directory, removed at the end of the test.
struct temporary_file {
    std::filesystem::path path;
    explicit temporary_file(const std::string& name)
        : path(std::filesystem::temp_directory_path() / ("dl_serialize_" + name + ".safetensors")) {}
    ~temporary_file() { std::filesystem::remove(path); }
};

/// Same shape and the same elements, NaN matching NaN.
template <class T>
bool same_values(const Tensor<T>& a, const Tensor<T>& b) {
    if (a.shape() != b.shape()) return false;
    const auto x = dl_test::to_vector(a), y = dl_test::to_vector(b);
    for (std::size_t i = 0; i < x.size(); ++i) {
        const auto u = static_cast<double>(x[i]), v = static_cast<double>(y[i]);
        if (!(u == v || (std::isnan(u) && std::isnan(v)))) return false;
    }
    return true;
}

/// Saves f, loads it back, and checks the loaded graph prints the same, then runs both on `inputs`
/// (with both strategies) and checks every output is bit for bit the same.
graph::function round_trip(graph::function& f, std::span<const any_tensor> inputs, const std::string& name) {
    temporary_file file(name);
    graph::save(f, file.path);
    graph::function loaded = graph::load(file.path, f.context());
    CHECK(loaded.graph().to_string() == f.graph().to_string());
    const auto expected = f.run(inputs);
    for (auto how : {graph::strategy::in_order, graph::strategy::parallel}) {
        loaded.set_strategy(how);
        const auto got = loaded.run(inputs);
        REQUIRE(got.size() == expected.size());
        for (std::size_t i = 0; i < got.size(); ++i)
            std::visit(
                [&]<class V>(const V& want) {
                    if constexpr (!std::is_same_v<V, std::monostate>) {
                        INFO(loaded.graph().to_string());
                        CHECK(same_values(std::get<V>(got[i]), want));
                    }
                },
                expected[i]);
    }
    return loaded;
}

}  // namespace

TEST_CASE("graph serialization: an MLP loads back as the same graph and computes the same bits") {
    dl::Context ctx({.seed = 11, .threads = 2});
    dl::nn::sequential m{dl::nn::linear<float>(6, 5, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(5, 3, false, ctx),
                         dl::nn::log_softmax{}};
    auto f = graph::trace([&](const Tensor<float>& x) { return m(x); }, dl::uniform<float>({4, 6}, -1, 1, ctx));
    for (bool optimized : {false, true}) {
        CAPTURE(optimized);
        if (optimized) f.optimize();
        for (std::int64_t batch : {1, 4, 9}) {
            const any_tensor x[] = {dl::uniform<float>({batch, 6}, -2, 2, ctx)};
            const graph::function loaded = round_trip(f, x, "mlp");
            // Parameters stay parameters, with the values they had, and the loaded graph owns them.
            std::size_t parameters = 0;
            for (std::size_t id = 0; id < loaded.graph().values.size(); ++id) {
                const graph::value& v = loaded.graph().values[id];
                if (v.source != graph::value_source::parameter) continue;
                ++parameters;
                const auto& t = std::get<Tensor<float>>(v.data);
                CHECK(t.requires_grad());
                const auto& saved = std::get<Tensor<float>>(f.graph().values[id].data);
                CHECK(dl_test::same_elements(t, saved));
                CHECK(!t.shares_storage(saved));
            }
            CHECK(parameters == 3);  // two weights, one bias
        }
    }
    // The eager model gives what the loaded graph gives.
    const Tensor<float> x = dl::uniform<float>({7, 6}, -2, 2, ctx);
    temporary_file file("mlp_eager");
    graph::save(f, file.path);
    graph::traced<Tensor<float>> loaded(graph::load(file.path, ctx));
    CHECK(dl_test::same_elements(loaded(x), m(x), 1e-5));
}

TEST_CASE("graph serialization: the Fashion-MNIST CNN with every inference pass round-trips") {
    dl::Context ctx({.seed = 12, .threads = 2});
    dl::nn::batch_norm<float> bn(4, {}, ctx);
    {
        const dl::no_grad off(ctx);
        bn.running_mean = dl::uniform<float>({4}, -1, 1, ctx);
        bn.running_var = dl::uniform<float>({4}, 0.5, 2, ctx);
    }
    dl::nn::sequential m{dl::nn::conv2d<float>(1, 4, 3, {.padding = 1}, true, ctx), std::move(bn), dl::nn::relu{},
                         dl::nn::max_pool2d({.kernel = 2}), dl::nn::conv2d<float>(4, 6, 3, {.padding = 1}, false, ctx),
                         dl::nn::gelu{}, dl::nn::avg_pool2d({.kernel = 2}), dl::nn::flatten{},
                         dl::nn::linear<float>(6 * 2 * 2, 5, true, ctx), dl::nn::softmax{}};
    m.train(false);
    auto f = graph::trace([&](const Tensor<float>& x) { return m(x); }, dl::uniform<float>({2, 1, 8, 8}, 0, 1, ctx));
    const any_tensor x[] = {dl::uniform<float>({5, 1, 8, 8}, 0, 1, ctx)};
    round_trip(f, x, "cnn_plain");
    f.optimize(graph::inference_passes());
    CHECK(f.graph().memory.planned);
    graph::function loaded = round_trip(f, x, "cnn_optimized");
    CHECK(loaded.graph().memory.peak_bytes_after == f.graph().memory.peak_bytes_after);
    const auto eager = m(std::get<Tensor<float>>(x[0]));
    CHECK(dl_test::same_elements(std::get<Tensor<float>>(loaded.run(x)[0]), eager, 1e-5));
}

TEST_CASE("graph serialization: elementwise ops of every kind, scalars on either side, fused or not") {
    dl::Context ctx({.seed = 13, .threads = 2});
    auto body = [](const Tensor<float>& a, const Tensor<float>& b) {
        const Tensor<float> s = dl::where(a > 0.25f, dl::exp(a) * 2.0f, 1.0f - b);
        const Tensor<float> t = dl::clamp(s, -0.5f, 3.0f) + dl::leaky_relu(b, 0.2) + dl::elu(a, 0.7);
        const Tensor<double> wide = dl::cast<double>(t / (dl::abs(b) + 1.0f));
        const Tensor<bool> mask = dl::logical_and(a < b, !dl::isnan(b));
        return std::tuple{Tensor<float>(dl::pow(dl::sigmoid(t), 2.0f) - dl::tanh(a) + dl::maximum(a, b)), wide,
                          Tensor<float>(dl::where(mask, a, b))};
    };
    const auto a = dl::uniform<float>({3, 5}, -1, 1, ctx), b = dl::uniform<float>({3, 5}, -1, 1, ctx);
    auto f = graph::trace(body, a, b);
    Tensor<float> na = dl::uniform<float>({6, 5}, -1, 1, ctx), nb = dl::uniform<float>({6, 5}, -1, 1, ctx);
    na.at(0, 0) = std::numeric_limits<float>::quiet_NaN();
    nb.at(1, 1) = std::numeric_limits<float>::infinity();
    const any_tensor inputs[] = {na, nb};
    round_trip(f, inputs, "elementwise");
    f.optimize();
    CHECK(std::any_of(f.graph().nodes.begin(), f.graph().nodes.end(), [](const graph::node& n) { return n.fused(); }));
    round_trip(f, inputs, "elementwise_fused");
}

TEST_CASE("graph serialization: views, joins, indexing, reductions and layer_norm") {
    dl::Context ctx({.seed = 15, .threads = 2});
    const Tensor<float> table = dl::uniform<float>({10, 4}, -1, 1, ctx);
    const Tensor<std::int64_t> rows({3}, ctx);
    rows.data()[0] = 7, rows.data()[1] = 0, rows.data()[2] = 7;
    dl::nn::layer_norm<float> norm({4}, 1e-5, true, ctx);
    auto body = [&](const Tensor<float>& x, const Tensor<std::int32_t>& ids) {
        const Tensor<float> picked = dl::index_select(table, 0, rows);                       // [3, 4]
        const Tensor<float> joined = dl::cat(std::vector{x.slice(1, 0, 4), x.slice(1, 2, 6)}, 0);       // [2N, 4]
        const Tensor<float> stacked = dl::stack(std::vector{joined.transpose(0, 1), joined.transpose(0, 1)}, 2);
        const Tensor<float> bags = dl::embedding_bag(table, ids.reshape({-1}), dl::arange<std::int32_t>(0, 4, 2, ctx),
                                                     dl::bag_mode::sum);
        const Tensor<float> reduced = dl::sum(stacked, {2}) + dl::mean(stacked, {2}) * 0.5f;
        return std::tuple{norm(joined), Tensor<float>(dl::max(reduced, {1}, true)), dl::var(picked, {0}),
                          dl::argmax(joined, 1), dl::norm(bags, 2.0, {1}), x.select(1, 3).unsqueeze(1).expand({-1, 3}),
                          dl::gather(picked, 1, Tensor<std::int64_t>(dl::zeros<std::int64_t>({3, 2}, ctx))),
                          dl::logsumexp(x.permute({1, 0}), {0})};
    };
    Tensor<std::int32_t> ids({2, 2}, ctx);
    for (int i = 0; i < 4; ++i) ids.data()[i] = 9 - 2 * i;
    auto f = graph::trace(body, dl::uniform<float>({2, 6}, -1, 1, ctx), ids);
    const any_tensor inputs[] = {dl::uniform<float>({3, 6}, -1, 1, ctx), ids};
    // The bag offsets are a constant of the traced batch: run at that batch only.
    const any_tensor same_batch[] = {dl::uniform<float>({2, 6}, -1, 1, ctx), ids};
    round_trip(f, same_batch, "views");
    f.optimize();
    round_trip(f, same_batch, "views_optimized");
    static_cast<void>(inputs);
}

TEST_CASE("graph serialization: elementwise nodes read broadcast and strided operands as their ops do") {
    // A loaded elementwise node, and a fused one, read each operand as one contiguous run: one that
    // broadcasts along some dimensions, or a strided view, is copied out through its strides first.
    dl::Context ctx({.seed = 16, .threads = 2});
    auto body = [](const Tensor<float>& a, const Tensor<float>& rows, const Tensor<float>& c) {
        const Tensor<float> spread = a + rows;                        // rows [3, 1]: along dimensions 0 and 2
        const Tensor<float> turned = a.transpose(1, 2) * 2.0f + 1.0f;  // a strided view, then a chain
        const Tensor<float> column = c * c.slice(1, 2, 3);            // a strided column, broadcast along 1
        return std::tuple{spread, turned, column};
    };
    const Tensor<float> rows = dl::uniform<float>({3, 1}, -1, 1, ctx);
    auto f = graph::trace(body, dl::uniform<float>({2, 3, 4}, -1, 1, ctx), rows, dl::uniform<float>({2, 5}, -1, 1, ctx));
    Tensor<float> a = dl::uniform<float>({5, 3, 4}, -1, 1, ctx);
    a.at(1, 2, 3) = std::numeric_limits<float>::quiet_NaN();
    const Tensor<float> c = dl::uniform<float>({5, 5}, -1, 1, ctx);
    const any_tensor inputs[] = {a, rows, c};
    const auto [spread, turned, column] = body(a, rows, c);
    for (const bool optimized : {false, true}) {
        if (optimized) {
            f.optimize();
            CHECK(std::any_of(f.graph().nodes.begin(), f.graph().nodes.end(), [](const graph::node& n) { return n.fused(); }));
        }
        graph::function loaded = round_trip(f, inputs, optimized ? "broadcast_strided_optimized" : "broadcast_strided");
        const auto got = loaded.run(inputs);
        CHECK(same_values(std::get<Tensor<float>>(got[0]), spread));
        CHECK(same_values(std::get<Tensor<float>>(got[1]), turned));
        CHECK(same_values(std::get<Tensor<float>>(got[2]), column));
    }
}

TEST_CASE("graph serialization: what cannot be rebuilt is refused by name when saving") {
    dl::Context ctx({.seed = 16, .threads = 2});
    temporary_file file("refused");
    SUBCASE("dropout in training mode has effects") {
        dl::nn::dropout drop(0.5);
        auto f = graph::trace([&](const Tensor<float>& x) { return drop(x); }, dl::uniform<float>({4, 3}, -1, 1, ctx));
        const std::string message = dl_test::error_message([&] { graph::save(f, file.path); });
        CHECK(message.find("node 0 (dropout) cannot be saved") != std::string::npos);
        CHECK(message.find("evaluation mode") != std::string::npos);
        CHECK(!std::filesystem::exists(file.path));
    }
    SUBCASE("a quantized graph: its int8 weights are not tensors") {
        dl::nn::linear<float> layer(4, 3, true, ctx);
        auto f = graph::trace([&](const Tensor<float>& x) { return layer(x); }, dl::uniform<float>({2, 4}, -1, 1, ctx));
        graph::pass_manager passes = graph::default_passes();
        passes.add(graph::quantize_int8({{dl::uniform<float>({2, 4}, -1, 1, ctx)}}));
        f.optimize(passes);
        const std::string message = dl_test::error_message([&] { graph::save(f, file.path); });
        CHECK(message.find("(quantized_linear) cannot be saved: its int8 weights are not tensors") != std::string::npos);
    }
}

TEST_CASE("graph serialization: a load compiles the dtypes it lists, and says which to add") {
    dl::Context ctx({.seed = 18, .threads = 2});
    temporary_file file("dtypes");
    SUBCASE("bfloat16 ops need load<..., bfloat16>") {
        const Tensor<dl::bfloat16> bias = dl::uniform<dl::bfloat16>({5}, -1, 1, ctx);
        auto f = graph::trace([&](const Tensor<dl::bfloat16>& x) { return Tensor<dl::bfloat16>(dl::relu(x + bias)); },
                              dl::uniform<dl::bfloat16>({3, 5}, -1, 1, ctx));
        graph::save(f, file.path);
        const std::string message = dl_test::error_message([&] { static_cast<void>(graph::load(file.path, ctx)); });
        CHECK(message.find(": node 0 (add) computes in bfloat16; this load was compiled for float32 (list it") != std::string::npos);
    }
    SUBCASE("integer arithmetic is refused; integer casts are not") {
        auto f = graph::trace([](const Tensor<std::int32_t>& x) { return Tensor<float>(dl::cast<float>(x) * 0.5f); },
                              dl::zeros<std::int32_t>({2, 2}, ctx));
        graph::save(f, file.path);
        graph::function loaded = graph::load(file.path, ctx);
        Tensor<std::int32_t> x({3, 2}, ctx);
        for (int i = 0; i < 6; ++i) x.data()[i] = i - 2;
        const any_tensor in[] = {x};
        CHECK(dl_test::same_elements(std::get<Tensor<float>>(loaded.run(in)[0]), Tensor<float>(dl::cast<float>(x) * 0.5f)));
        auto g = graph::trace([](const Tensor<std::int32_t>& v) { return Tensor<std::int32_t>(v + 1); },
                              dl::zeros<std::int32_t>({2, 2}, ctx));
        graph::save(g, file.path);
        const std::string message = dl_test::error_message([&] { static_cast<void>(graph::load(file.path, ctx)); });
        CHECK(message.find(": node 0 (add) computes in int32, which dl loads for casts only") != std::string::npos);
    }
}

TEST_CASE("graph serialization: corrupt and foreign files fail with what is wrong") {
    dl::Context ctx({.seed = 17, .threads = 2});
    dl::nn::linear<float> layer(3, 2, true, ctx);
    auto f = graph::trace([&](const Tensor<float>& x) { return dl::relu(layer(x)); }, dl::uniform<float>({2, 3}, -1, 1, ctx));
    temporary_file good("good"), bad("bad");
    graph::save(f, good.path);
    auto failure = [&] { return dl_test::error_message([&] { static_cast<void>(graph::load(bad.path, ctx)); }); };
    // Rewrites the saved file with its graph JSON edited by `edit`.
    auto edited = [&](auto&& edit) {
        const dl::nn::safetensors_file source(good.path);
        nlohmann::json g = nlohmann::json::parse(source.metadata().at("dl.graph"));
        edit(g);
        dl::nn::safetensors_writer w;
        for (const auto& [name, stored] : source.tensors()) w.add(name, source.get<float>(name, ctx));
        w.set_metadata("format", "dl.graph");
        w.set_metadata("dl.graph", g.dump());
        w.write(bad.path);
        return failure();
    };

    CHECK(dl_test::error_message([&] { static_cast<void>(graph::load("/nonexistent/graph.safetensors", ctx)); })
              .find("cannot open") != std::string::npos);
    {
        dl::nn::save_checkpoint(bad.path, layer);
        CHECK(failure().find("is not a dl graph") != std::string::npos);
    }
    {
        std::filesystem::copy_file(good.path, bad.path, std::filesystem::copy_options::overwrite_existing);
        std::filesystem::resize_file(bad.path, std::filesystem::file_size(good.path) - 3);
        CHECK(failure().find("truncated") != std::string::npos);
    }
    CHECK(edited([](nlohmann::json& g) { g["version"] = 99; }).find("format version 99") != std::string::npos);
    CHECK(edited([](nlohmann::json& g) { g.erase("nodes"); }).find("malformed graph") != std::string::npos);
    CHECK(edited([](nlohmann::json& g) { g["nodes"][0]["op"] = "teleport"; }).find("dl cannot rebuild this op") !=
          std::string::npos);
    CHECK(edited([](nlohmann::json& g) { g["nodes"][0]["inputs"][0] = 1000; }).find("refers to %1000, which does not exist") !=
          std::string::npos);
    CHECK(edited([](nlohmann::json& g) { g["nodes"][0]["attributes"] = "act=9"; }).find("(linear) has an unknown activation 9") !=
          std::string::npos);
    CHECK(edited([](nlohmann::json& g) { g["nodes"][0]["kind"] = "view"; }).find("does not rebuild as saved") !=
          std::string::npos);
    CHECK(edited([](nlohmann::json& g) { g["values"][3]["shape"] = {2, 7}; }).find("(linear) makes float32 [2, 2], the file says") !=
          std::string::npos);
    CHECK(edited([](nlohmann::json& g) { g["values"][1]["shape"] = {5, 5}; }).find("tensor %1 is float32") != std::string::npos);
    CHECK(edited([](nlohmann::json& g) { std::swap(g["nodes"][0], g["nodes"][1]); }).find("before it is made") !=
          std::string::npos);
    CHECK(edited([](nlohmann::json& g) { g["nodes"][1]["kind"] = "effectful"; }).find("has kind \"effectful\"") !=
          std::string::npos);
    // A file that loads still works after all that.
    graph::function loaded = graph::load(good.path, ctx);
    const any_tensor x[] = {dl::uniform<float>({3, 3}, -1, 1, ctx)};
    CHECK(dl_test::same_elements(std::get<Tensor<float>>(loaded.run(x)[0]), Tensor<float>(dl::relu(layer(std::get<Tensor<float>>(x[0])))), 1e-6));
}

namespace {

/// The system allocator, refusing (and remembering) any block over 64 MiB: a test of what a load
/// allocates that cannot exhaust the machine when the load is wrong.
class capped_allocator final : public dl::Allocator {
public:
    std::size_t largest = 0;
    void* allocate(std::size_t bytes) override {
        largest = std::max(largest, bytes);
        if (bytes > (std::size_t(64) << 20)) throw std::bad_alloc();
        return system_.allocate(bytes);
    }
    void deallocate(void* block, std::size_t bytes) noexcept override { system_.deallocate(block, bytes); }
    dl::allocator_stats stats() const override { return system_.stats(); }

private:
    dl::system_allocator system_;
};

/// f (relu of a linear layer over [2, 3]) saved to `file`.
graph::function saved_linear(dl::Context& ctx, dl::nn::linear<float>& layer, const temporary_file& file) {
    auto f = graph::trace([&](const Tensor<float>& x) { return dl::relu(layer(x)); }, dl::uniform<float>({2, 3}, -1, 1, ctx));
    graph::save(f, file.path);
    return f;
}

std::vector<char> bytes_of(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}
void write_all(const std::filesystem::path& p, const std::vector<char>& bytes) {
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace

TEST_CASE("graph serialization: a small file declaring huge values allocates nothing for them") {
    auto allocator = std::make_shared<capped_allocator>();
    dl::Context ctx({.seed = 17, .threads = 1, .allocator = allocator});
    dl::nn::linear<float> layer(3, 2, true, ctx);
    temporary_file good("huge_good"), bad("huge_bad");
    static_cast<void>(saved_linear(ctx, layer, good));
    auto with_input_shape = [&](std::vector<std::int64_t> shape) {
        const dl::nn::safetensors_file source(good.path);
        nlohmann::json g = nlohmann::json::parse(source.metadata().at("dl.graph"));
        REQUIRE(g["values"][0]["source"] == "input");
        g["values"][0]["shape"] = shape;
        g["values"][3]["shape"] = {shape[0], 2};  // the linear's result, as a consistent file would say
        g["values"][4]["shape"] = {shape[0], 2};
        dl::nn::safetensors_writer w;
        for (const auto& [name, stored] : source.tensors()) w.add(name, source.get<float>(name, ctx));
        w.set_metadata("format", "dl.graph");
        w.set_metadata("dl.graph", g.dump());
        w.write(bad.path);
        allocator->largest = 0;
        return dl_test::error_message([&] { static_cast<void>(graph::load(bad.path, ctx)); });
    };
    // A 40 GB float input in a file of a few KB.
    const std::string m = with_input_shape({100000, 100000});
    CHECK(std::filesystem::file_size(bad.path) < 4096);
    CHECK(allocator->largest < (std::size_t(1) << 20));
    CHECK(m.find(bad.path.string()) != std::string::npos);
    CHECK(m.find("rebuilding its kernels needs 40000800000 bytes") != std::string::npos);
    // Extents whose product overflows are named, never wrapped.
    const std::string wrapped = with_input_shape({4294967296, 4294967296});
    CHECK(allocator->largest < (std::size_t(1) << 20));
    CHECK(wrapped.find("value %0 has shape [4294967296, 4294967296], too many elements to address") != std::string::npos);
    // The caller may allow more; the graph still loads and runs at its own shapes.
    CHECK(dl_test::error_message([&] { static_cast<void>(graph::load(good.path, ctx, {.max_rebuild_bytes = 16})); })
              .find("more than the limit of 16 bytes (graph::load_options::max_rebuild_bytes)") != std::string::npos);
    graph::function loaded = graph::load(good.path, ctx, {.max_rebuild_bytes = 1 << 20});
    const any_tensor x[] = {dl::uniform<float>({2, 3}, -1, 1, ctx)};
    CHECK(dl_test::same_elements(std::get<Tensor<float>>(loaded.run(x)[0]),
                                 Tensor<float>(dl::relu(layer(std::get<Tensor<float>>(x[0])))), 1e-6));
}

TEST_CASE("graph serialization: every flipped byte of the weights or of the graph is detected") {
    dl::Context ctx({.seed = 17, .threads = 1});
    dl::nn::linear<float> layer(3, 2, true, ctx);
    temporary_file good("flip_good"), bad("flip_bad");
    static_cast<void>(saved_linear(ctx, layer, good));
    const auto bytes = bytes_of(good.path);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    const std::size_t data = 8 + n;
    REQUIRE(bytes.size() == data + 4 * (6 + 2));
    auto load_flipped = [&](std::size_t at, unsigned char flip) {
        auto copy = bytes;
        copy[at] = static_cast<char>(copy[at] ^ flip);
        write_all(bad.path, copy);
        return dl_test::error_message([&] { static_cast<void>(graph::load(bad.path, ctx)); });
    };
    for (std::size_t at = data; at < bytes.size(); ++at)
        for (const unsigned char flip : {0x01, 0x80}) {
            CAPTURE(at);
            const std::string m = load_flipped(at, flip);
            CHECK(m.find("damaged tensor data (CRC32C mismatch)") != std::string::npos);
            CHECK(m.find(bad.path.string()) != std::string::npos);
        }
    // The graph itself (ops, attributes, shapes) is JSON text in the header; a flip there either breaks
    // the JSON or changes the text its checksum covers.
    const std::string header(bytes.data() + 8, n);
    const std::string key = R"("dl.graph":")";
    const std::size_t begin = header.find(key) + key.size(), end = header.find(R"(","dl.graph.crc32c")");
    REQUIRE(begin != std::string::npos);
    REQUIRE(end != std::string::npos);
    REQUIRE(end > begin + 100);
    for (std::size_t at = begin; at < end; ++at) {
        CAPTURE(at);
        const std::string m = load_flipped(8 + at, 0x01);
        CHECK(m != "<no dl::error>");
        CHECK(m.find(bad.path.string()) != std::string::npos);
    }
    CHECK(dl_test::error_message([&] { static_cast<void>(graph::load(good.path, ctx)); }) == "<no dl::error>");
}
