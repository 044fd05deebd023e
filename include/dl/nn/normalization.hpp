#pragma once
// Normalization layers. batch_norm keeps running statistics as buffers (visited by for_each_buffer,
// for checkpoints; optimizers do not see them).
#include <cstdint>
#include <string_view>

#include "../autograd/normalization.hpp"
#include "layer.hpp"

namespace dl::nn {

struct batch_norm_options {
    double eps = 1e-5, momentum = 0.1;
    bool affine = true;               ///< learnable weight (ones) and bias (zeros)
    bool track_running_stats = true;  ///< false: batch statistics in evaluation too
};

/// Batch normalization over channel dimension 1 of [N, C] or [N, C, L] (BatchNorm1d) and [N, C, H, W]
/// (BatchNorm2d) inputs.
template <class T = float>
class batch_norm {
public:
    explicit batch_norm(std::int64_t channels, batch_norm_options options = {}, Context& ctx = default_context())
        : options_(options) {
        if (channels <= 0) dl::detail::fail("dl::nn::batch_norm: channels must be positive, got ", channels);
        if (options.affine) {
            weight = ones<T>({channels}, ctx).requires_grad_();
            bias = zeros<T>({channels}, ctx).requires_grad_();
        }
        if (options.track_running_stats) {
            running_mean = zeros<T>({channels}, ctx);
            running_var = ones<T>({channels}, ctx);
        }
    }

    Tensor<T> operator()(const Tensor<T>& x) {
        const std::int64_t c = channels();
        if (x.rank() < 2 || x.rank() > 4 || x.shape()[1] != c)
            dl::detail::fail("dl::nn::batch_norm: expected input [N, ", c, "], [N, ", c, ", L] or [N, ", c,
                             ", H, W], got shape ", x.shape());
        const bool batch_stats = training_ || !options_.track_running_stats;
        return dl::batch_norm(x, running_mean, running_var, weight, bias, batch_stats, options_.momentum, options_.eps);
    }
    template <class F>
    void for_each_parameter(F&& f) {
        if (weight.defined()) f(std::string_view("weight"), weight), f(std::string_view("bias"), bias);
    }
    template <class F>
    void for_each_buffer(F&& f) {
        if (running_mean.defined())
            f(std::string_view("running_mean"), running_mean), f(std::string_view("running_var"), running_var);
    }
    void train(bool on = true) { training_ = on; }
    [[nodiscard]] std::int64_t channels() const noexcept {
        return weight.defined() ? weight.numel() : running_mean.numel();
    }

    Tensor<T> weight, bias, running_mean, running_var;

private:
    batch_norm_options options_;
    bool training_ = true;
};

/// Layer normalization over the trailing dimensions given by `normalized_shape`, with a learnable
/// elementwise weight (ones) and bias (zeros) of that shape when `affine`.
template <class T = float>
class layer_norm {
public:
    explicit layer_norm(Shape normalized_shape, double eps = 1e-5, bool affine = true, Context& ctx = default_context())
        : shape_(normalized_shape), eps_(eps) {
        if (shape_.size() == 0 || shape_.numel() <= 0)
            dl::detail::fail("dl::nn::layer_norm: the normalized shape must be non-empty, got ", shape_);
        if (affine) {
            weight = ones<T>(shape_, ctx).requires_grad_();
            bias = zeros<T>(shape_, ctx).requires_grad_();
        }
    }

    Tensor<T> operator()(const Tensor<T>& x) {
        const int k = shape_.size(), r = x.rank();
        bool fits = r >= k;
        for (int d = 0; fits && d < k; ++d) fits = x.shape()[r - k + d] == shape_[d];
        if (!fits)
            dl::detail::fail("dl::nn::layer_norm: expected input [..., ", shape_, "] (trailing dimensions), got shape ",
                             x.shape());
        return dl::layer_norm(x, k, weight, bias, eps_);
    }
    template <class F>
    void for_each_parameter(F&& f) {
        if (weight.defined()) f(std::string_view("weight"), weight), f(std::string_view("bias"), bias);
    }
    void train(bool = true) {}

    Tensor<T> weight, bias;

private:
    Shape shape_;
    double eps_;
};

}  // namespace dl::nn
