// Serves a model without its source: loads the inference graph examples/fashion_mnist exports
// (fashion_mnist_graph.safetensors: raw uint8 pixels in, class scores and predicted classes out),
// classifies the 10,000 Fashion-MNIST test images in batches, and ends with the lines
// `test_accuracy=<fraction correct>` (as the training run printed it) and `images_per_second=...`.
// Run: scripts/run-example fashion_mnist, then scripts/run-example serve [--graph FILE] [--batch N]
// [--threads N] [--data DIR]
//
// The graph is loaded for float32 (dl::graph::load<float>); a graph trained with --dtype bf16 needs
// dl::graph::load<float, dl::bfloat16>, which compiles every op a second time.
#include <dl/data.hpp>
#include <dl/graph/serialize.hpp>
#include <dl/prof/progress.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>

namespace {

using dl::Tensor;

struct settings {
    std::string graph = "fashion_mnist_graph.safetensors", data;
    std::int64_t batch = 256;
    int threads = 2;
};

settings parse(int argc, char** argv) {
    settings s;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + std::string(flag));
            return argv[++i];
        };
        if (flag == "--graph") s.graph = value();
        else if (flag == "--batch") s.batch = std::stoll(value());
        else if (flag == "--threads") s.threads = std::stoi(value());
        else if (flag == "--data") s.data = value();
        else throw std::runtime_error("unknown flag " + std::string(flag) + " (flags: --graph FILE, --batch N, --threads N, --data DIR)");
    }
    if (s.batch < 1) throw std::runtime_error("--batch must be at least 1");
    if (!std::filesystem::exists(s.graph))
        throw std::runtime_error("no graph at " + s.graph + ": run scripts/run-example fashion_mnist first (it exports one)");
    return s;
}

}  // namespace

int main(int argc, char** argv) try {
    const settings s = parse(argc, argv);
    dl::Context ctx({.seed = 1, .threads = s.threads});
    dl::graph::function classify = dl::graph::load(s.graph, ctx);
    std::int64_t parameters = 0;
    for (const auto& v : classify.graph().values)
        if (v.source == dl::graph::value_source::parameter || v.source == dl::graph::value_source::constant)
            parameters += v.shape.numel();
    std::cout << "loaded " << s.graph << ": " << classify.graph().nodes.size() << " nodes, " << parameters
              << " weights\n";

    const auto test = dl::data::load_fashion_mnist(false, s.data, ctx);
    const std::int64_t n = test.images.shape()[0];
    const std::int64_t batches = (n + s.batch - 1) / s.batch;
    std::int64_t correct = 0;
    dl::prof::progress_bar bar("classifying", batches, s.batch, std::cout, {.unit = "images"});
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t b = 0; b < batches; ++b) {
        const std::int64_t begin = b * s.batch, end = std::min(n, begin + s.batch);
        const dl::autograd::any_tensor images[] = {test.images.slice(0, begin, end)};
        const auto outputs = classify.run(images);
        const auto& predicted = std::get<Tensor<std::int64_t>>(outputs.at(1));
        for (std::int64_t i = 0; i < end - begin; ++i)
            correct += predicted.at(i) == static_cast<std::int64_t>(test.labels.at(begin + i));
        bar.update(b + 1, {{"accuracy", double(correct) / double(end)}}, end);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bar.finish();
    std::printf("test_accuracy=%.4f\nimages_per_second=%.0f\n", double(correct) / double(n), double(n) / seconds);
    return 0;
} catch (const std::exception& e) {
    std::cerr << "serve: " << e.what() << '\n';
    return 1;
}
