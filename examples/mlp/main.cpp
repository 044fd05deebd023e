// Two ways to build a model, trained on the same toy task (is a point inside the unit circle?):
// flat compile-time composition with nn::sequential, and a user struct with layer members.
#include <dl/dl.hpp>

#include <cstdio>

namespace nn = dl::nn;

/// A model as a struct: members are layers, forward is a call operator, parameters are visited by name.
struct circle_net {
    nn::linear<float> hidden, out;
    explicit circle_net(dl::Context& ctx) : hidden(2, 32, true, ctx), out(32, 2, true, ctx) {}
    dl::Tensor<float> operator()(const dl::Tensor<float>& x) { return out(dl::Tensor<float>(dl::gelu(hidden(x)))); }
    template <class F>
    void for_each_parameter(F&& f) {
        nn::visit(f, "hidden", hidden);
        nn::visit(f, "out", out);
    }
    void train(bool on = true) {
        hidden.train(on);
        out.train(on);
    }
};

/// Trains `model` for a few hundred Adam steps and returns the accuracy on fresh points.
template <class Model>
double fit(Model& model, dl::Context& ctx) {
    nn::adam<float> opt(nn::parameters(model), {.lr = 0.01});
    auto batch = [&](std::int64_t n) {
        auto x = dl::uniform<float>({n, 2}, -1.5, 1.5, ctx);
        auto inside = dl::Tensor<std::int64_t>(dl::cast<std::int64_t>(dl::sum(dl::square(x), {1}) < 1.0f));
        return std::pair{x, inside};
    };
    for (int step = 0; step < 400; ++step) {
        auto [x, y] = batch(64);
        auto loss = nn::cross_entropy(model(x), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        if (step % 100 == 0) std::printf("  step %3d  loss %.4f\n", step, static_cast<double>(loss.item()));
    }
    dl::no_grad off(ctx);
    auto [x, y] = batch(2000);
    auto predicted = dl::argmax(model(x), 1);
    return dl::mean(dl::cast<double>(predicted == y)).item();
}

int main() {
    dl::Context ctx({.seed = 42});
    nn::sequential flat{nn::linear<float>(2, 32, true, ctx), nn::tanh{}, nn::linear<float>(32, 2, true, ctx)};
    std::printf("sequential<linear, tanh, linear>:\n");
    std::printf("accuracy=%.4f\n", fit(flat, ctx));

    circle_net net(ctx);
    std::printf("struct circle_net (%lld parameters):\n", static_cast<long long>(nn::parameter_count(net)));
    std::printf("accuracy=%.4f\n", fit(net, ctx));
}
