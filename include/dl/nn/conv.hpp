#pragma once
// Convolution and pooling layers over NCHW images: the functions of autograd/conv.hpp with their
// parameters and settings held.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "../autograd/conv.hpp"
#include "init.hpp"
#include "layer.hpp"

namespace dl::nn {

/// 2-D convolution: weight [out, in / groups, kh, kw] and bias [out], initialised as PyTorch's Conv2d
/// (U(±1/√fan_in)).
template <class T = float>
class conv2d {
public:
    conv2d(std::int64_t in, std::int64_t out, extent2 kernel, conv2d_options options = {}, bool bias = true,
           Context& ctx = default_context())
        : options_(options) {
        if (in <= 0 || out <= 0 || kernel.h <= 0 || kernel.w <= 0 || options.groups <= 0 || in % options.groups ||
            out % options.groups)
            dl::detail::fail("dl::nn::conv2d: channels (", in, " -> ", out, "), kernel (", kernel.h, ", ", kernel.w,
                             ") and groups ", options.groups, " must be positive, the channels divisible by groups");
        weight = Tensor<T>({out, in / options.groups, kernel.h, kernel.w}, ctx);
        init::kaiming_uniform_(weight, std::sqrt(1.0 / 3.0));
        weight.requires_grad_();
        if (bias) {
            this->bias = Tensor<T>({out}, ctx);
            const double bound = 1.0 / std::sqrt(static_cast<double>(weight.numel() / out));
            init::uniform_(this->bias, -bound, bound);
            this->bias.requires_grad_();
        }
    }

    Tensor<T> operator()(const Tensor<T>& x) { return (*this)(x, options_.act); }
    /// The convolution with `act` in its epilogue in place of the options' activation
    /// (sequential<conv2d, relu> runs this when the options name none).
    Tensor<T> operator()(const Tensor<T>& x, activation act) {
        const std::int64_t in = weight.shape()[1] * options_.groups;
        check_input(x, "conv2d", 4, 1, in, [in] { return "[N, " + std::to_string(in) + ", H, W]"; });
        conv2d_options o = options_;
        o.act = act;
        return dl::conv2d(x, weight, bias, o);
    }
    [[nodiscard]] activation epilogue() const noexcept { return options_.act; }
    template <class F>
    void for_each_parameter(F&& f) {
        f(std::string_view("weight"), weight);
        if (bias.defined()) f(std::string_view("bias"), bias);
    }
    void train(bool = true) {}

    Tensor<T> weight, bias;

private:
    conv2d_options options_;
};

struct max_pool2d : stateless {
    pool2d_options options;
    explicit max_pool2d(pool2d_options o) : options(o) {}
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) const {
        return dl::max_pool2d(x, options);
    }
};

struct avg_pool2d : stateless {
    pool2d_options options;
    explicit avg_pool2d(pool2d_options o) : options(o) {}
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) const {
        return dl::avg_pool2d(x, options);
    }
};

struct adaptive_avg_pool2d : stateless {
    extent2 output;
    explicit adaptive_avg_pool2d(extent2 out) : output(out) {}
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) const {
        return dl::adaptive_avg_pool2d(x, output);
    }
};

}  // namespace dl::nn
