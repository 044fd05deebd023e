#pragma once
// Optimizers. Each holds handles to the parameters (sharing their storage and gradient) and its state
// beside them; step() updates each parameter in ONE loop that reads the gradient and state and writes
// both (SIMD over contiguous parameters), under no_grad. Updates run with denormals flushed to zero:
// Adam's moments of rarely-updated weights decay into the denormal range, where x86 arithmetic is
// ~100x slower.
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#define DL_HAVE_MXCSR 1
#endif

#include "../autograd/node.hpp"
#include "../expr/math.hpp"

namespace dl::nn {

namespace detail {

/// Sets flush-to-zero and denormals-are-zero on this thread for its lifetime.
class flush_denormals {
public:
#ifdef DL_HAVE_MXCSR
    flush_denormals() noexcept : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
    ~flush_denormals() { _mm_setcsr(saved_); }

private:
    unsigned saved_;
#endif
};

/// Runs update(V& p, V g, V& s0, V& s1) over the elements of a contiguous parameter, its gradient and
/// up to two state tensors, on SIMD batches and then one scalar tail.
template <class T, class Update>
void for_each_element(Tensor<T>& p, const Tensor<T>& g, Tensor<T>* s0, Tensor<T>* s1, Update update) {
    const std::int64_t n = p.numel();
    T* pd = p.data();
    const T* gd = g.data();
    T* a = s0 ? s0->data() : nullptr;
    T* b = s1 ? s1->data() : nullptr;
    std::int64_t i = 0;
#ifndef DL_NO_SIMD
    if constexpr (simd::has_batch<T>) {
        using B = simd::batch<T>;
        constexpr int W = simd::width<T>;
        for (; i + W <= n; i += W) {
            B pv = simd::load(pd + i), av = a ? simd::load(a + i) : B(T(0)), bv = b ? simd::load(b + i) : B(T(0));
            update(pv, simd::load(gd + i), av, bv);
            simd::store(pd + i, pv);
            if (a) simd::store(a + i, av);
            if (b) simd::store(b + i, bv);
        }
    }
#endif
    for (; i < n; ++i) {
        T pv = pd[i], av = a ? a[i] : T(0), bv = b ? b[i] : T(0);
        update(pv, gd[i], av, bv);
        pd[i] = pv;
        if (a) a[i] = av;
        if (b) b[i] = bv;
    }
}

template <class T>
void check_parameters(const std::vector<Tensor<T>>& params, std::string_view name) {
    for (const auto& p : params) {
        if (!p.requires_grad() || !p.is_leaf())
            dl::detail::fail("dl::nn::", name, ": parameters must be leaf tensors that require grad");
        if (!p.is_contiguous()) dl::detail::fail("dl::nn::", name, ": parameters must be contiguous");
    }
}

template <class T>
[[nodiscard]] std::vector<Tensor<T>> zeros_like_all(const std::vector<Tensor<T>>& params) {
    std::vector<Tensor<T>> out;
    out.reserve(params.size());
    for (const auto& p : params) out.push_back(zeros<T>(p.shape(), p.context()));
    return out;
}

}  // namespace detail

/// Sets every parameter's gradient to zero (keeping the buffers, so the next backward allocates nothing).
template <class T>
void zero_grad(const std::vector<Tensor<T>>& params) {
    for (const auto& p : params)
        if (auto g = p.grad(); g.defined()) g.fill(T(0));
}

/// Scales the gradients so that their global L2 norm is at most max_norm; returns the norm before.
template <class T>
double clip_grad_norm(const std::vector<Tensor<T>>& params, double max_norm) {
    double total = 0;
    for (const auto& p : params)
        if (auto g = p.grad(); g.defined())
            for (std::int64_t i = 0; i < g.numel(); ++i) total += static_cast<double>(g.data()[i]) * g.data()[i];
    const double norm = std::sqrt(total);
    if (norm > max_norm && norm > 0)
        for (const auto& p : params)
            if (auto g = p.grad(); g.defined()) g *= static_cast<T>(max_norm / norm);
    return norm;
}

struct sgd_options {
    double lr = 0.01, momentum = 0, weight_decay = 0, dampening = 0;
    bool nesterov = false;
};

/// Stochastic gradient descent with momentum, Nesterov momentum and L2 weight decay, as torch.optim.SGD.
template <class T = float>
class sgd {
public:
    sgd(std::vector<Tensor<T>> params, sgd_options o) : params_(std::move(params)), o_(o) {
        detail::check_parameters(params_, "sgd");
        if (o.momentum != 0) velocity_ = detail::zeros_like_all(params_);
    }
    void step() {
        detail::flush_denormals ftz;
        const T lr = T(o_.lr), wd = T(o_.weight_decay), mu = T(o_.momentum), damp = T(1 - o_.dampening);
        const bool first = steps_++ == 0, nesterov = o_.nesterov;
        for (std::size_t i = 0; i < params_.size(); ++i) {
            Tensor<T> g = params_[i].grad();
            if (!g.defined()) continue;
            Tensor<T>* v = velocity_.empty() ? nullptr : &velocity_[i];
            detail::for_each_element(params_[i], g, v, static_cast<Tensor<T>*>(nullptr), [&]<class V>(V& p, V d, V& b, V&) {
                d = d + V(wd) * p;
                if (v) {
                    b = first ? d : V(mu) * b + V(damp) * d;
                    d = nesterov ? d + V(mu) * b : b;
                }
                p = p - V(lr) * d;
            });
        }
    }
    void zero_grad() { nn::zero_grad(params_); }
    void set_lr(double lr) noexcept { o_.lr = lr; }
    [[nodiscard]] double lr() const noexcept { return o_.lr; }
    [[nodiscard]] const std::vector<Tensor<T>>& params() const noexcept { return params_; }

private:
    std::vector<Tensor<T>> params_, velocity_;
    sgd_options o_;
    std::int64_t steps_ = 0;
};

struct adam_options {
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
    bool decoupled_weight_decay = false;  ///< true: AdamW
};

/// Adam (Kingma & Ba) with bias correction; AdamW when decoupled_weight_decay, as torch.optim.
template <class T = float>
class adam {
public:
    adam(std::vector<Tensor<T>> params, adam_options o = {}) : params_(std::move(params)), o_(o) {
        detail::check_parameters(params_, "adam");
        m_ = detail::zeros_like_all(params_);
        v_ = detail::zeros_like_all(params_);
    }
    void step() {
        detail::flush_denormals ftz;
        ++steps_;
        const double c1 = 1 - std::pow(o_.beta1, static_cast<double>(steps_));
        const double c2 = 1 - std::pow(o_.beta2, static_cast<double>(steps_));
        const T b1 = T(o_.beta1), b2 = T(o_.beta2), eps = T(o_.eps);
        const T step_size = T(o_.lr / c1), inv_sqrt_c2 = T(1 / std::sqrt(c2));
        const T wd = T(o_.weight_decay), decay = T(1 - o_.lr * o_.weight_decay);
        const bool decoupled = o_.decoupled_weight_decay;
        for (std::size_t i = 0; i < params_.size(); ++i) {
            Tensor<T> g = params_[i].grad();
            if (!g.defined()) continue;
            detail::for_each_element(params_[i], g, &m_[i], &v_[i], [&]<class V>(V& p, V d, V& m, V& v) {
                if (decoupled)
                    p = p * V(decay);
                else
                    d = d + V(wd) * p;
                m = V(b1) * m + V(T(1) - b1) * d;
                v = V(b2) * v + V(T(1) - b2) * d * d;
                p = p - V(step_size) * m / (math::sqrt(v) * V(inv_sqrt_c2) + V(eps));
            });
        }
    }
    void zero_grad() { nn::zero_grad(params_); }
    void set_lr(double lr) noexcept { o_.lr = lr; }
    [[nodiscard]] double lr() const noexcept { return o_.lr; }
    [[nodiscard]] const std::vector<Tensor<T>>& params() const noexcept { return params_; }

private:
    std::vector<Tensor<T>> params_, m_, v_;
    adam_options o_;
    std::int64_t steps_ = 0;
};

}  // namespace dl::nn
