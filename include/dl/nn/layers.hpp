#pragma once
// Basic layers: linear, activations, flatten, dropout. Each follows the contract in layer.hpp.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "../autograd/elementwise.hpp"
#include "../autograd/softmax.hpp"
#include "init.hpp"
#include "layer.hpp"

namespace dl::nn {

/// y = x·Wᵀ + b for x [N, in]; weight [out, in], bias [out], initialised as PyTorch does
/// (U(±1/√in)). Constructed with in = -1, the input size is taken from the first call.
template <class T = float>
class linear {
public:
    linear(std::int64_t in, std::int64_t out, bool bias = true, Context& ctx = default_context())
        : in_(in), out_(out), has_bias_(bias), ctx_(&ctx) {
        if (out <= 0 || in == 0 || in < -1)
            dl::detail::fail("dl::nn::linear: sizes must be positive, got in ", in, ", out ", out);
        if (in > 0) create();
    }

    Tensor<T> operator()(const Tensor<T>& x) { return (*this)(x, activation::none); }
    /// act(x·Wᵀ + b), the activation in the product's epilogue (sequential<linear, relu> runs this).
    Tensor<T> operator()(const Tensor<T>& x, activation act) {
        if (!weight.defined()) {
            if (x.rank() == 2) in_ = x.shape()[1];
            if (in_ <= 0) check_input(x, "linear", 2, 1, -1, [] { return "[N, features]"; });
            create();
        }
        check_input(x, "linear", 2, 1, in_, [this] { return "[N, " + std::to_string(in_) + "]"; });
        return dl::linear(x, weight, bias, act);
    }
    [[nodiscard]] static constexpr activation epilogue() noexcept { return activation::none; }

    template <class F>
    void for_each_parameter(F&& f) {
        if (weight.defined()) f(std::string_view("weight"), weight);
        if (bias.defined()) f(std::string_view("bias"), bias);
    }
    void train(bool = true) {}
    [[nodiscard]] std::int64_t in_features() const noexcept { return in_; }
    [[nodiscard]] std::int64_t out_features() const noexcept { return out_; }

    Tensor<T> weight, bias;

private:
    void create() {
        weight = Tensor<T>({out_, in_}, *ctx_);
        init::kaiming_uniform_(weight, std::sqrt(1.0 / 3.0));
        weight.requires_grad_();
        if (has_bias_) {
            bias = Tensor<T>({out_}, *ctx_);
            const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
            init::uniform_(bias, -bound, bound);
            bias.requires_grad_();
        }
    }
    std::int64_t in_, out_;
    bool has_bias_;
    Context* ctx_;
};

// --- activations as layers: the same functions as the elementwise ops ---
#define DL_ACTIVATION_LAYER(name)                          \
    struct name : stateless {                              \
        template <class T>                                 \
        Tensor<T> operator()(const Tensor<T>& x) const {   \
            return dl::name(x);                            \
        }                                                  \
    };
DL_ACTIVATION_LAYER(relu)
DL_ACTIVATION_LAYER(tanh)
DL_ACTIVATION_LAYER(sigmoid)
DL_ACTIVATION_LAYER(gelu)
DL_ACTIVATION_LAYER(silu)
DL_ACTIVATION_LAYER(softplus)
#undef DL_ACTIVATION_LAYER
template <>
inline constexpr activation epilogue_of<relu> = activation::relu;
template <>
inline constexpr activation epilogue_of<tanh> = activation::tanh;
template <>
inline constexpr activation epilogue_of<sigmoid> = activation::sigmoid;
template <>
inline constexpr activation epilogue_of<gelu> = activation::gelu;

struct leaky_relu : stateless {
    double slope = 0.01;
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) const {
        return dl::leaky_relu(x, slope);
    }
};
struct elu : stateless {
    double alpha = 1.0;
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) const {
        return dl::elu(x, alpha);
    }
};
struct softmax : stateless {
    std::int64_t dim = -1;
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) const {
        return dl::softmax(x, dim);
    }
};
struct log_softmax : stateless {
    std::int64_t dim = -1;
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) const {
        return dl::log_softmax(x, dim);
    }
};

/// Merges dimensions start..end (default: all but the batch dimension).
struct flatten : stateless {
    std::int64_t start = 1, end = -1;
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) const {
        return x.flatten(start, end);
    }
};

/// Zeroes each element with probability p in training (scaling the rest by 1/(1-p)); identity in
/// evaluation. The mask comes from the input's Context random stream.
class dropout {
public:
    explicit dropout(double p = 0.5) : p_(p) {
        if (!(p >= 0 && p < 1)) dl::detail::fail("dl::nn::dropout: p must be in [0, 1), got ", p);
    }
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) const {
        if (!training_ || p_ == 0) return x;
        if (auto* r = x.context().recorder())
            return autograd::record_op(*r, "dropout", autograd::attributes("p", p_), autograd::op_kind::effectful,
                                       [self = *this](const Tensor<T>& in) { return self(in); }, x);
        const Tensor<T> u = dl::uniform<T>(x.shape(), 0, 1, x.context());
        return where(u >= T(p_), x * T(1 / (1 - p_)), T(0));
    }
    template <class F>
    void for_each_parameter(F&&) {}
    void train(bool on = true) { training_ = on; }

private:
    double p_;
    bool training_ = true;
};

}  // namespace dl::nn
