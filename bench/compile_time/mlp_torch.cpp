// Compile-time baseline (scripts/bench compile_time): examples/mlp/main.cpp written with libtorch's
// C++ API, the same two models trained the same way, so that the two translation units compare.
#include <torch/torch.h>

#include <cstdio>

namespace nn = torch::nn;

/// A model as a struct: members are layers, forward is a call operator, parameters registered by name.
struct circle_net : nn::Module {
    nn::Linear hidden{nullptr}, out{nullptr};
    circle_net() : hidden(register_module("hidden", nn::Linear(2, 32))), out(register_module("out", nn::Linear(32, 2))) {}
    torch::Tensor forward(const torch::Tensor& x) { return out(torch::gelu(hidden(x))); }
};

/// Trains `model` for a few hundred Adam steps and returns the accuracy on fresh points.
template <class Model>
double fit(Model& model) {
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
    auto batch = [](std::int64_t n) {
        auto x = torch::rand({n, 2}) * 3.0 - 1.5;
        auto inside = (x.square().sum(1) < 1.0).to(torch::kLong);
        return std::pair{x, inside};
    };
    for (int step = 0; step < 400; ++step) {
        auto [x, y] = batch(64);
        auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        if (step % 100 == 0) std::printf("  step %3d  loss %.4f\n", step, loss.template item<double>());
    }
    torch::NoGradGuard off;
    auto [x, y] = batch(2000);
    auto predicted = model->forward(x).argmax(1);
    return (predicted == y).to(torch::kDouble).mean().template item<double>();
}

int main() {
    torch::manual_seed(42);
    nn::Sequential flat(nn::Linear(2, 32), nn::Tanh(), nn::Linear(32, 2));
    std::printf("sequential<linear, tanh, linear>:\n");
    std::printf("accuracy=%.4f\n", fit(flat));

    auto net = std::make_shared<circle_net>();
    std::int64_t count = 0;
    for (const auto& p : net->parameters()) count += p.numel();
    std::printf("struct circle_net (%lld parameters):\n", static_cast<long long>(count));
    std::printf("accuracy=%.4f\n", fit(net));
}
