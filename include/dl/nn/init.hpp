#pragma once
// Initialisers. They draw from the Context's counter-based stream: the same seed gives the same
// weights whatever the thread count. Fan-in/fan-out follow PyTorch: dimension 1 and dimension 0 (times
// the receptive field for convolution kernels).
#include <cmath>
#include <cstdint>

#include "../core/creation.hpp"
#include "../autograd/node.hpp"

namespace dl::nn::init {

struct fans {
    double in, out;
};
inline fans fans_of(const Shape& s) {
    if (s.size() < 2) return {static_cast<double>(s.numel()), static_cast<double>(s.numel())};
    double field = 1;
    for (int d = 2; d < s.size(); ++d) field *= static_cast<double>(s[d]);
    return {static_cast<double>(s[1]) * field, static_cast<double>(s[0]) * field};
}

/// Overwrites t (not recorded) with values drawn from U(low, high).
template <class T>
void uniform_(Tensor<T>& t, double low, double high) {
    no_grad off(t.context());
    t.copy_from(dl::uniform<T>(t.shape(), low, high, t.context()));
}
template <class T>
void normal_(Tensor<T>& t, double mean, double stddev) {
    no_grad off(t.context());
    t.copy_from(dl::normal<T>(t.shape(), mean, stddev, t.context()));
}
template <class T>
void zeros_(Tensor<T>& t) {
    t.fill(T(0));
}
template <class T>
void ones_(Tensor<T>& t) {
    t.fill(T(1));
}
/// Glorot & Bengio: variance 2 / (fan_in + fan_out).
template <class T>
void xavier_uniform_(Tensor<T>& t, double gain = 1) {
    const auto f = fans_of(t.shape());
    const double bound = gain * std::sqrt(6.0 / (f.in + f.out));
    uniform_(t, -bound, bound);
}
template <class T>
void xavier_normal_(Tensor<T>& t, double gain = 1) {
    const auto f = fans_of(t.shape());
    normal_(t, 0, gain * std::sqrt(2.0 / (f.in + f.out)));
}
/// He et al.: variance gain² / fan_in, gain √2 for ReLU. PyTorch's Linear default is
/// kaiming_uniform_ with gain √(1/3), i.e. U(±1/√fan_in).
template <class T>
void kaiming_uniform_(Tensor<T>& t, double gain = std::sqrt(2.0)) {
    const double bound = gain * std::sqrt(3.0 / fans_of(t.shape()).in);
    uniform_(t, -bound, bound);
}
template <class T>
void kaiming_normal_(Tensor<T>& t, double gain = std::sqrt(2.0)) {
    normal_(t, 0, gain / std::sqrt(fans_of(t.shape()).in));
}

}  // namespace dl::nn::init
