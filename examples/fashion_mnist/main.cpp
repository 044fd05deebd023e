// Trains a small CNN (or an MLP) on the 60,000 Fashion-MNIST training images and evaluates it on the
// 10,000 test images. Run: scripts/run-example fashion_mnist [--model cnn|mlp] [--epochs N]
// [--threads N] [--batch N] [--lr X] [--channels C1,C2] [--dtype float|bf16] [--data DIR] [--out DIR]
//
// --dtype bf16 trains in mixed precision: bfloat16 weights, activations and gradients, with float
// master weights and Adam state in the optimizer.
//
// Training runs through dl::nn::fit (examples/mlp writes the loop by hand). It writes to --out
// (default: the working directory) the checkpoint (fashion_mnist.safetensors, model and
// optimizer), the traced inference graph (fashion_mnist_graph.safetensors, which examples/serve
// runs), the per-epoch curves (fashion_mnist_curves.csv and .svg) and a profile of 50 training
// steps (a table on stdout, fashion_mnist_trace.json for Perfetto / chrome://tracing), and ends with
// the lines `test_accuracy=0.xxxx` and `train_seconds=...` (training wall time).
#include <dl/data.hpp>
#include <dl/graph/serialize.hpp>
#include <dl/prof/profiler.hpp>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>

namespace {

using dl::Tensor;

struct settings {
    std::string model = "cnn", data, out = ".";
    int epochs = 3, threads = 2;
    std::int64_t channels1 = 16, channels2 = 32;  ///< of the two convolutions
    std::int64_t batch = 64;
    double lr = 2e-3;
    std::string dtype = "float";
};

settings parse(int argc, char** argv) {
    settings s;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + std::string(flag));
            return argv[++i];
        };
        if (flag == "--model") s.model = value();
        else if (flag == "--epochs") s.epochs = std::stoi(value());
        else if (flag == "--threads") s.threads = std::stoi(value());
        else if (flag == "--batch") s.batch = std::stoll(value());
        else if (flag == "--lr") s.lr = std::stod(value());
        else if (flag == "--data") s.data = value();
        else if (flag == "--out") s.out = value();
        else if (flag == "--channels") {  // "C1,C2"
            const std::string v = value();
            const auto comma = v.find(',');
            if (comma == std::string::npos) throw std::runtime_error("--channels wants C1,C2, e.g. 32,64");
            s.channels1 = std::stoll(v.substr(0, comma));
            s.channels2 = std::stoll(v.substr(comma + 1));
        }
        else if (flag == "--dtype") s.dtype = value();
        else {
            throw std::runtime_error("unknown flag " + std::string(flag) +
                                     " (flags: --model cnn|mlp, --epochs, --threads, --batch, --lr, --channels C1,C2, "
                                     "--dtype float|bf16, --data, --out)");
        }
    }
    if (s.model != "cnn" && s.model != "mlp") throw std::runtime_error("--model must be cnn or mlp");
    if (s.dtype != "float" && s.dtype != "bf16") throw std::runtime_error("--dtype must be float or bf16");
    return s;
}

/// uint8 images [B, 28, 28] -> T [B, 1, 28, 28] normalised with the training set's mean and standard
/// deviation (computed in float, rounded once to T); labels to int64.
template <class T>
struct to_tensors {
    dl::data::batch<T, std::int64_t> operator()(dl::data::batch<std::uint8_t, std::uint8_t> b) const {
        const std::int64_t n = b.inputs.shape()[0];
        Tensor<T> x = (dl::cast<float>(b.inputs) * (1.0f / 255.0f) - 0.2860f) * (1.0f / 0.3530f);
        Tensor<std::int64_t> y = dl::cast<std::int64_t>(b.targets);
        return {x.reshape({n, 1, 28, 28}), y, b.index, b.seed};
    }
};

template <class T, class Model>
int train(Model& model, const settings& s, dl::Context& ctx) {
    using loader_t = dl::data::data_loader<std::uint8_t, std::uint8_t, to_tensors<T>>;
    auto train_split = dl::data::load_fashion_mnist(true, s.data, ctx);
    auto test_split = dl::data::load_fashion_mnist(false, s.data, ctx);
    loader_t train_data({train_split.images, train_split.labels}, {.batch_size = s.batch, .shuffle = true}, ctx);
    loader_t test_data({test_split.images, test_split.labels}, {.batch_size = 500, .shuffle = false}, ctx);
    std::cout << "Fashion-MNIST: " << train_data.size() << " training and " << test_data.size() << " test images; "
              << s.model << " with " << dl::nn::parameter_count(model) << " parameters (" << s.dtype << "), "
              << s.threads << " threads\n";

    dl::nn::adam<T> opt(dl::nn::parameters<T>(model), {.lr = s.lr});
    dl::nn::cosine_lr schedule(opt, train_data.batches_per_epoch() * s.epochs, s.lr * 0.05);
    const std::filesystem::path out(s.out);
    std::filesystem::create_directories(out);
    std::ofstream curves(out / "fashion_mnist_curves.csv");
    curves << "epoch,train_loss,train_accuracy,test_loss,test_accuracy,seconds\n";
    dl::prof::series train_loss{"train loss", {}}, test_loss{"test loss", {}}, train_accuracy{"train accuracy", {}},
        test_accuracy{"test accuracy", {}};

    dl::prof::profiler profiler;
    const auto result = dl::nn::fit(
        model, opt, [](const Tensor<T>& scores, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(scores, y); },
        train_data, &test_data,
        {.epochs = s.epochs,
         .after_step =
             [&](dl::nn::step_info& step) {
                 schedule.step();
                 // Profile 50 steps once the loop is warm: a table per op type and a Chrome trace.
                 if (step.step == 10) ctx.set_profiler(&profiler);
                 if (step.step == 60) ctx.set_profiler(nullptr);
             },
         .after_epoch =
             [&](dl::nn::epoch_info& e) {
                 curves << e.epoch << ',' << e.train_loss << ',' << e.train_accuracy << ',' << e.eval_loss << ','
                        << e.eval_accuracy << ',' << e.seconds << std::endl;
                 train_loss.values.push_back(e.train_loss);
                 test_loss.values.push_back(e.eval_loss);
                 train_accuracy.values.push_back(e.train_accuracy);
                 test_accuracy.values.push_back(e.eval_accuracy);
             }});

    dl::nn::save_checkpoint(out / "fashion_mnist.safetensors", model, &opt);
    // Export for serving (examples/serve): raw uint8 pixels in, class scores and predicted classes out,
    // with the normalisation traced into the graph, so the server needs neither this source nor it.
    model.train(false);
    auto classify = [&](const Tensor<std::uint8_t>& images) {
        Tensor<T> x = (dl::cast<float>(images) * (1.0f / 255.0f) - 0.2860f) * (1.0f / 0.3530f);
        Tensor<T> scores = model(x.reshape({images.shape()[0], 1, 28, 28}));
        return std::tuple{scores, dl::argmax(scores, 1)};
    };
    auto graph = dl::graph::trace(classify, test_split.images.slice(0, 0, 8));
    graph.optimize();
    dl::graph::save(graph, out / "fashion_mnist_graph.safetensors");
    dl::prof::write_svg_plot(out / "fashion_mnist_curves.svg", "Fashion-MNIST, " + s.model,
                             {{train_loss, test_loss}, {train_accuracy, test_accuracy}});
    profiler.write_chrome_trace(out / "fashion_mnist_trace.json");
    std::cout << "\nprofile of training steps 11-60 (self time per op type):\n" << profiler.table();
    std::printf("saved in %s: fashion_mnist.safetensors (model and optimizer), fashion_mnist_graph.safetensors (the "
                "inference graph, for scripts/run-example serve), fashion_mnist_curves.csv and .svg, "
                "fashion_mnist_trace.json (open in https://ui.perfetto.dev)\n",
                std::filesystem::absolute(out).string().c_str());
    std::printf("test_accuracy=%.4f\ntrain_seconds=%.1f\n", result.epochs.back().eval_accuracy, result.train_seconds);
    return 0;
}

template <class T>
int run(const settings& s, dl::Context& ctx) {
    if (s.model == "mlp") {
        dl::nn::sequential model{dl::nn::flatten{}, dl::nn::linear<T>(784, 256, true, ctx), dl::nn::relu{},
                                 dl::nn::linear<T>(256, 128, true, ctx), dl::nn::relu{},
                                 dl::nn::linear<T>(128, 10, true, ctx)};
        return train<T>(model, s, ctx);
    }
    const std::int64_t c1 = s.channels1, c2 = s.channels2;
    dl::nn::sequential model{dl::nn::conv2d<T>(1, c1, 3, {.padding = 1}, true, ctx), dl::nn::relu{},
                             dl::nn::max_pool2d({.kernel = 2}),
                             dl::nn::conv2d<T>(c1, c2, 3, {.padding = 1}, true, ctx), dl::nn::relu{},
                             dl::nn::max_pool2d({.kernel = 2}), dl::nn::flatten{},
                             dl::nn::linear<T>(c2 * 7 * 7, 128, true, ctx), dl::nn::relu{},
                             dl::nn::linear<T>(128, 10, true, ctx)};
    return train<T>(model, s, ctx);
}

}  // namespace

int main(int argc, char** argv) try {
    const settings s = parse(argc, argv);
    dl::Context ctx({.seed = 1, .threads = s.threads});
    return s.dtype == "bf16" ? run<dl::bfloat16>(s, ctx) : run<float>(s, ctx);
} catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << '\n';
    return 1;
}
