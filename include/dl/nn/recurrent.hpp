#pragma once
// Recurrent layers over batch-first sequences x [N, L, in]. The input projection of all steps is one
// matrix product; each step adds the recurrent product and updates the state in one fused expression
// (one recorded node per state tensor). Parameter names and gate order follow PyTorch (weight_ih_l0,
// ...; LSTM gates i, f, g, o; GRU gates r, z, n), so weights interchange.
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include "../autograd/elementwise.hpp"
#include "../autograd/indexing.hpp"
#include "init.hpp"
#include "layer.hpp"

namespace dl::nn {

namespace detail {

/// The parameters of one recurrent layer with `gates` gates, initialised U(±1/√hidden) as PyTorch.
template <class T>
struct recurrent_parameters {
    recurrent_parameters(std::int64_t in, std::int64_t hidden, std::int64_t gates, std::string_view name, Context& ctx)
        : hidden_size(hidden) {
        if (in <= 0 || hidden <= 0)
            dl::detail::fail("dl::nn::", name, ": sizes must be positive, got input ", in, ", hidden ", hidden);
        const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
        for (Tensor<T>* p : {&weight_ih, &weight_hh, &bias_ih, &bias_hh}) {
            const Shape shape = p == &weight_ih   ? Shape{gates * hidden, in}
                                : p == &weight_hh ? Shape{gates * hidden, hidden}
                                                  : Shape{gates * hidden};
            *p = Tensor<T>(shape, ctx);
            init::uniform_(*p, -bound, bound);
            p->requires_grad_();
        }
    }
    template <class F>
    void for_each(F&& f) {
        f(std::string_view("weight_ih_l0"), weight_ih), f(std::string_view("weight_hh_l0"), weight_hh);
        f(std::string_view("bias_ih_l0"), bias_ih), f(std::string_view("bias_hh_l0"), bias_hh);
    }
    /// x·W_ihᵀ + b_ih for every step at once: [N, L, gates * hidden].
    [[nodiscard]] Tensor<T> input_projection(const Tensor<T>& x, std::string_view name) const {
        if (x.rank() != 3 || x.shape()[2] != weight_ih.shape()[1])
            dl::detail::fail("dl::nn::", name, ": expected input [N, L, ", weight_ih.shape()[1], "], got shape ",
                             x.shape());
        const std::int64_t n = x.shape()[0], steps = x.shape()[1];
        return dl::linear(x.reshape({n * steps, x.shape()[2]}), weight_ih, bias_ih).reshape({n, steps, weight_ih.shape()[0]});
    }
    [[nodiscard]] Tensor<T> initial_state(const Tensor<T>& given, std::int64_t n, std::string_view name) const {
        if (!given.defined()) return zeros<T>({n, hidden_size}, weight_ih.context());
        if (given.shape() != Shape{n, hidden_size})
            dl::detail::fail("dl::nn::", name, ": expected a state [", n, ", ", hidden_size, "], got shape ",
                             given.shape());
        return given;
    }

    std::int64_t hidden_size;
    Tensor<T> weight_ih, weight_hh, bias_ih, bias_hh;
};

}  // namespace detail

/// The outputs of an LSTM: every step's hidden state [N, L, hidden], and the last h and c [N, hidden].
template <class T>
struct lstm_result {
    Tensor<T> output, h, c;
};

/// Long short-term memory, one layer: c' = σ(f)·c + σ(i)·tanh(g), h' = σ(o)·tanh(c').
template <class T = float>
class lstm {
public:
    lstm(std::int64_t input_size, std::int64_t hidden_size, Context& ctx = default_context())
        : p_(input_size, hidden_size, 4, "lstm", ctx) {}

    lstm_result<T> operator()(const Tensor<T>& x, const Tensor<T>& h0 = {}, const Tensor<T>& c0 = {}) {
        const Tensor<T> projected = p_.input_projection(x, "lstm");
        const std::int64_t n = x.shape()[0], steps = x.shape()[1], hid = p_.hidden_size;
        Tensor<T> h = p_.initial_state(h0, n, "lstm"), c = p_.initial_state(c0, n, "lstm");
        std::vector<Tensor<T>> outputs;
        outputs.reserve(static_cast<std::size_t>(steps));
        for (std::int64_t t = 0; t < steps; ++t) {
            const Tensor<T> gates = dl::linear(h, p_.weight_hh, p_.bias_hh);
            const Tensor<T> xt = projected.select(1, t);
            auto gate = [&](std::int64_t k) { return xt.slice(1, k * hid, (k + 1) * hid) + gates.slice(1, k * hid, (k + 1) * hid); };
            // New tensors each step, never writes into the old state: outputs hold every step's h.
            c = Tensor<T>(dl::sigmoid(gate(1)) * c + dl::sigmoid(gate(0)) * dl::tanh(gate(2)));
            h = Tensor<T>(dl::sigmoid(gate(3)) * dl::tanh(c));
            outputs.push_back(h);
        }
        Tensor<T> output = steps ? stack(outputs, 1) : zeros<T>({n, 0, hid}, x.context());
        return {std::move(output), std::move(h), std::move(c)};
    }
    template <class F>
    void for_each_parameter(F&& f) {
        p_.for_each(f);
    }
    void train(bool = true) {}
    [[nodiscard]] detail::recurrent_parameters<T>& parameters() noexcept { return p_; }

private:
    detail::recurrent_parameters<T> p_;
};

/// The outputs of a GRU: every step's hidden state [N, L, hidden] and the last one [N, hidden].
template <class T>
struct gru_result {
    Tensor<T> output, h;
};

/// Gated recurrent unit, one layer: r = σ(x_r + h_r), z = σ(x_z + h_z), n = tanh(x_n + r·h_n),
/// h' = (1 - z)·n + z·h (h_* include b_hh, as PyTorch).
template <class T = float>
class gru {
public:
    gru(std::int64_t input_size, std::int64_t hidden_size, Context& ctx = default_context())
        : p_(input_size, hidden_size, 3, "gru", ctx) {}

    gru_result<T> operator()(const Tensor<T>& x, const Tensor<T>& h0 = {}) {
        const Tensor<T> projected = p_.input_projection(x, "gru");
        const std::int64_t n = x.shape()[0], steps = x.shape()[1], hid = p_.hidden_size;
        Tensor<T> h = p_.initial_state(h0, n, "gru");
        std::vector<Tensor<T>> outputs;
        outputs.reserve(static_cast<std::size_t>(steps));
        for (std::int64_t t = 0; t < steps; ++t) {
            const Tensor<T> hg = dl::linear(h, p_.weight_hh, p_.bias_hh);
            const Tensor<T> xt = projected.select(1, t);
            auto part = [hid](const Tensor<T>& g, std::int64_t k) { return g.slice(1, k * hid, (k + 1) * hid); };
            const auto z = dl::sigmoid(part(xt, 1) + part(hg, 1));
            h = Tensor<T>((T(1) - z) * dl::tanh(part(xt, 2) + dl::sigmoid(part(xt, 0) + part(hg, 0)) * part(hg, 2)) + z * h);
            outputs.push_back(h);
        }
        Tensor<T> output = steps ? stack(outputs, 1) : zeros<T>({n, 0, hid}, x.context());
        return {std::move(output), std::move(h)};
    }
    template <class F>
    void for_each_parameter(F&& f) {
        p_.for_each(f);
    }
    void train(bool = true) {}
    [[nodiscard]] detail::recurrent_parameters<T>& parameters() noexcept { return p_; }

private:
    detail::recurrent_parameters<T> p_;
};

}  // namespace dl::nn
