#pragma once
// Optimizers. Each holds handles to the parameters (sharing their storage and gradient) and its state
// beside them; step() updates each parameter in ONE loop that reads the gradient and state and writes
// both (SIMD over contiguous parameters), under no_grad. Updates run with denormals flushed to zero
// unless the parameters' Context says otherwise (context_options::flush_denormals): Adam's moments of
// rarely-updated weights decay into the denormal range, where x86 arithmetic is ~100x slower.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <string_view>
#include <vector>

#include "../autograd/node.hpp"
#include "../device/cpu/elementwise.hpp"
#include "../expr/math.hpp"

namespace dl::nn {

namespace detail {

/// Runs update(V& p, V g, V& state...) over the elements of a contiguous parameter (or master copy),
/// its gradient (of the parameter's element type, widened on load and multiplied by `grad_scale`) and
/// its state tensors (same shape), on SIMD batches and then one scalar tail: ONE pass over memory.
/// A large parameter's elements are split over the Context's threads, as an eager loop would split
/// them (chunk_length: only the array's own tail takes the scalar path), so results do not depend on
/// the thread count.
template <class C, class G, class Update, class... State>
    requires(std::is_same_v<State, Tensor<C>> && ...)
void for_each_element(Tensor<C>& p, const Tensor<G>& g, C grad_scale, Update update, State&... state) {
    const std::int64_t n = p.numel();
    // The loop runs on copies of the pointers and of `update` (whose captures must be by value): the
    // originals escape into parallel_for, and an intrinsic store may alias anything that escaped, so
    // GCC reloaded every pointer and captured scalar on every vector. SGD on the 16-64-64-4 MLP spent
    // 660 ns per step in this loop, 420 ns with the copies (the rest: L2 traffic).
    auto run_range = [&](std::int64_t begin, std::int64_t end) {
        [begin, end, f = update, pd = p.data(), gd = g.data(), grad_scale](auto*... sd) mutable {
            std::int64_t i = begin;
#ifndef DL_NO_SIMD
            if constexpr (simd::has_batch<C>) {
                constexpr int W = simd::width<C>;
                const simd::batch<C> scale(grad_scale);
                for (; i + W <= end; i += W) {
                    auto pv = simd::load(pd + i);
                    [&](auto... sv) {
                        f(pv, simd::load_compute(gd + i) * scale, sv...);
                        (simd::store(sd + i, sv), ...);
                    }(simd::load(sd + i)...);
                    simd::store(pd + i, pv);
                }
            }
#endif
            for (; i < end; ++i) {
                C pv = pd[i];
                [&](auto... sv) {
                    f(pv, static_cast<C>(gd[i]) * grad_scale, sv...);
                    ((sd[i] = sv), ...);
                }(sd[i]...);
                pd[i] = pv;
            }
        }(state.data()...);
    };
    // Work per element: the streams read and written (parameter, gradient, each state).
    const std::int64_t chunks = dl::detail::parallel_chunks(n * (2 + static_cast<std::int64_t>(sizeof...(State))),
                                                            p.context().concurrency());
    if (chunks == 1) return run_range(0, n);
    const std::int64_t chunk = dl::detail::chunk_length(n, chunks);
    p.context().parallel_for(chunks, [&](std::int64_t c) { run_range(std::min(n, c * chunk), std::min(n, (c + 1) * chunk)); });
}

template <class T>
void check_parameters(const std::vector<Tensor<T>>& params, std::string_view name) {
    for (const auto& p : params) {
        if (!p.requires_grad() || !p.is_leaf())
            dl::detail::fail("dl::nn::", name, ": parameters must be leaf tensors that require grad");
        if (!p.is_contiguous()) dl::detail::fail("dl::nn::", name, ": parameters must be contiguous");
    }
}

/// Zero state tensors in the parameters' compute type (float for 16-bit parameters).
template <class T>
[[nodiscard]] std::vector<Tensor<compute_t<T>>> zeros_like_all(const std::vector<Tensor<T>>& params) {
    std::vector<Tensor<compute_t<T>>> out;
    out.reserve(params.size());
    for (const auto& p : params) out.push_back(zeros<compute_t<T>>(p.shape(), p.context()));
    return out;
}

}  // namespace detail

/// Clears every parameter's gradient. By default each is set to zero and keeps its buffer, which the
/// next backward adds into. With set_to_none the gradients are dropped instead (PyTorch's
/// zero_grad(set_to_none=True)): the next backward writes them rather than adding, which saves a pass
/// over each and the fill, and takes their buffers back from the context's caching allocator (no
/// malloc after warm-up either way). A parameter that then gets no gradient has none, and optimizer
/// steps skip it, where a zero gradient would still apply weight decay and momentum to it.
template <class T>
void zero_grad(const std::vector<Tensor<T>>& params, bool set_to_none = false) {
    for (const auto& p : params) {
        if (set_to_none) {
            if (auto* n = autograd::node_of(p)) n->drop_grad();
        } else if (auto g = p.grad(); g.defined()) {
            g.fill(T(0));
        }
    }
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

namespace detail {

/// What every optimizer shares: the parameter handles, the options (with lr), the step count and
/// the loop over parameters that have a gradient.
///
/// Mixed precision: for 16-bit parameters (bfloat16, float16) the optimizer keeps a float master copy of
/// each; updates and state are float, and each step ends by rounding the masters into the parameters.
/// Small updates then accumulate in the master instead of vanishing below the 16-bit ulp. The masters
/// are taken from the parameters at construction (and restored by load_checkpoint with the optimizer):
/// after writing parameters any other way, call sync_masters(), or the next step overwrites them.
template <class T, class Options>
class optimizer {
public:
    using compute_type = compute_t<T>;

    void zero_grad(bool set_to_none = false) { nn::zero_grad(params_, set_to_none); }
    void set_lr(double lr) noexcept { options_.lr = lr; }
    [[nodiscard]] double lr() const noexcept { return options_.lr; }
    [[nodiscard]] const Options& options() const noexcept { return options_; }
    [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
    /// For checkpoints: restores the step count (bias corrections and schedules depend on it).
    void set_steps(std::int64_t steps) noexcept { steps_ = steps; }
    [[nodiscard]] const std::vector<Tensor<T>>& params() const noexcept { return params_; }
    /// The float master copies of 16-bit parameters (empty for float and double parameters).
    [[nodiscard]] const std::vector<Tensor<compute_type>>& master_params() const noexcept { return masters_; }
    /// Re-reads the master copies from the 16-bit parameters (after they were set by hand).
    void sync_masters() {
        for (std::size_t i = 0; i < masters_.size(); ++i) assign(masters_[i], params_[i].detach());
    }
    /// Every gradient is multiplied by this as it is read (a loss_scaler's 1/scale); 1 by default.
    void set_grad_scale(double scale) noexcept { grad_scale_ = scale; }

protected:
    optimizer(std::vector<Tensor<T>> params, const Options& options, std::string_view name)
        : params_(std::move(params)), options_(options) {
        check_parameters(params_, name);
        if (!(options.lr >= 0)) dl::detail::fail("dl::nn::", name, ": lr must be >= 0, got ", options.lr);
        if constexpr (is_half_float<T>)
            for (const auto& p : params_) masters_.push_back(cast<compute_type>(p.detach()));
    }
    /// Counts a step and calls f(parameter or its master copy, gradient, index) for each parameter that
    /// has a gradient, with denormals flushed to zero; 16-bit parameters then take their master's value.
    template <class F>
    void for_each_parameter(F&& f) {
        const dl::flush_denormals mode(params_.empty() || params_[0].context().flushes_denormals());
        const op_scope scope(params_.empty() ? default_context() : params_[0].context(), "optimizer_step");
        ++steps_;
        for (std::size_t i = 0; i < params_.size(); ++i) {
            Tensor<T> g = params_[i].grad();
            if (!g.defined()) continue;
            if constexpr (is_half_float<T>) {
                f(masters_[i], g, i);
                Tensor<T> data = params_[i].detach();  // same storage, not recorded
                assign(data, masters_[i]);
            } else {
                f(params_[i], g, i);
            }
        }
    }
    [[nodiscard]] compute_type grad_scale() const noexcept { return static_cast<compute_type>(grad_scale_); }

    /// Calls f("<name>.<index>", tensor) for each tensor of one state list (for checkpoints).
    template <class F, class S>
    static void visit_state(F& f, std::string_view name, std::vector<Tensor<S>>& state) {
        for (std::size_t i = 0; i < state.size(); ++i) f(std::string(name) + "." + std::to_string(i), state[i]);
    }
    /// The master copies, for checkpoints (none for float parameters).
    template <class F>
    void visit_masters(F& f) {
        visit_state(f, "master", masters_);
    }

    std::vector<Tensor<T>> params_;
    std::vector<Tensor<compute_type>> masters_;
    Options options_;
    std::int64_t steps_ = 0;
    double grad_scale_ = 1;
};

}  // namespace detail

struct sgd_options {
    double lr = 0.01, momentum = 0, weight_decay = 0, dampening = 0;
    bool nesterov = false;
};

/// Stochastic gradient descent with momentum, Nesterov momentum and L2 weight decay, as torch.optim.SGD.
template <class T = float>
class sgd : public detail::optimizer<T, sgd_options> {
public:
    using C = compute_t<T>;  ///< state and update arithmetic (float for 16-bit parameters)

    sgd(std::vector<Tensor<T>> params, sgd_options o) : detail::optimizer<T, sgd_options>(std::move(params), o, "sgd") {
        if (o.momentum != 0) velocity_ = detail::zeros_like_all(this->params_);
    }
    void step() {
        const sgd_options& o = this->options_;
        const C lr = C(o.lr), wd = C(o.weight_decay), mu = C(o.momentum), damp = C(1 - o.dampening);
        const bool first = this->steps_ == 0, nesterov = o.nesterov;
        this->for_each_parameter([&](Tensor<C>& param, const Tensor<T>& g, std::size_t i) {
            if (velocity_.empty()) {
                detail::for_each_element(param, g, this->grad_scale(), [=]<class V>(V& p, V d) { p = p - V(lr) * (d + V(wd) * p); });
                return;
            }
            detail::for_each_element(param, g, this->grad_scale(), [=]<class V>(V& p, V d, V& b) {
                d = d + V(wd) * p;
                b = first ? d : V(mu) * b + V(damp) * d;
                d = nesterov ? d + V(mu) * b : b;
                p = p - V(lr) * d;
            }, velocity_[i]);
        });
    }

    /// Calls f(name, tensor) for each state tensor (for checkpoints).
    template <class F>
    void for_each_state(F&& f) {
        this->visit_masters(f);
        this->visit_state(f, "momentum", velocity_);
    }

private:
    std::vector<Tensor<C>> velocity_;
};

struct adam_options {
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
    bool decoupled_weight_decay = false;  ///< true: AdamW
};

/// Adam (Kingma & Ba) with bias correction; AdamW when decoupled_weight_decay, as torch.optim.
template <class T = float>
class adam : public detail::optimizer<T, adam_options> {
public:
    using C = compute_t<T>;  ///< state and update arithmetic (float for 16-bit parameters)

    adam(std::vector<Tensor<T>> params, adam_options o = {})
        : detail::optimizer<T, adam_options>(std::move(params), o, "adam"),
          m_(detail::zeros_like_all(this->params_)),
          v_(detail::zeros_like_all(this->params_)) {}
    void step() {
        const adam_options& o = this->options_;
        const double t = static_cast<double>(this->steps_ + 1);
        // The moments move toward each gradient by 1 - beta rounded to C (m += (1 - b1)(g - m)), so
        // their decay is 1 - beta to C's relative precision; b2 = 0.999 rounded to float instead
        // decays by 0.00099998713, and dividing by 1 - 0.999^t made every early step 6.4e-6 too
        // large. The bias corrections are computed from the same rounded complements.
        const C k1 = C(1 - o.beta1), k2 = C(1 - o.beta2), eps = C(o.eps);
        const double c1 = 1 - std::pow(1 - double(k1), t), c2 = 1 - std::pow(1 - double(k2), t);
        const C step_size = C(o.lr / c1), inv_sqrt_c2 = C(1 / std::sqrt(c2));
        const C wd = C(o.weight_decay), lr_wd = C(o.lr * o.weight_decay);
        const bool decoupled = o.decoupled_weight_decay;
        this->for_each_parameter([&](Tensor<C>& param, const Tensor<T>& g, std::size_t i) {
            detail::for_each_element(param, g, this->grad_scale(), [=]<class V>(V& p, V d, V& m, V& v) {
                if (decoupled)
                    p = p - V(lr_wd) * p;  // not p·(1 - lr·wd): 0.9999 in float is 1.7e-8 off
                else
                    d = d + V(wd) * p;
                m = m + V(k1) * (d - m);
                v = v + V(k2) * (d * d - v);
                p = p - V(step_size) * m / (math::sqrt(v) * V(inv_sqrt_c2) + V(eps));
            }, m_[i], v_[i]);
        });
    }

    /// Calls f(name, tensor) for each state tensor (for checkpoints).
    template <class F>
    void for_each_state(F&& f) {
        this->visit_masters(f);
        this->visit_state(f, "m", m_);
        this->visit_state(f, "v", v_);
    }

private:
    std::vector<Tensor<C>> m_, v_;
};

struct adagrad_options {
    double lr = 0.01, lr_decay = 0, weight_decay = 0, initial_accumulator_value = 0, eps = 1e-10;
};

/// Adagrad (Duchi et al.): per-element step lr / (√Σg² + eps), as torch.optim.Adagrad.
template <class T = float>
class adagrad : public detail::optimizer<T, adagrad_options> {
public:
    using C = compute_t<T>;  ///< state and update arithmetic (float for 16-bit parameters)

    adagrad(std::vector<Tensor<T>> params, adagrad_options o = {})
        : detail::optimizer<T, adagrad_options>(std::move(params), o, "adagrad") {
        for (const auto& p : this->params_)
            sum_.push_back(full<C>(p.shape(), C(o.initial_accumulator_value), p.context()));
    }
    void step() {
        const adagrad_options& o = this->options_;
        const C lr = C(o.lr / (1 + static_cast<double>(this->steps_) * o.lr_decay)), wd = C(o.weight_decay), eps = C(o.eps);
        this->for_each_parameter([&](Tensor<C>& param, const Tensor<T>& g, std::size_t i) {
            detail::for_each_element(param, g, this->grad_scale(), [=]<class V>(V& p, V d, V& s) {
                d = d + V(wd) * p;
                s = s + d * d;
                p = p - V(lr) * d / (math::sqrt(s) + V(eps));
            }, sum_[i]);
        });
    }

    /// Calls f(name, tensor) for each state tensor (for checkpoints).
    template <class F>
    void for_each_state(F&& f) {
        this->visit_masters(f);
        this->visit_state(f, "sum", sum_);
    }

private:
    std::vector<Tensor<C>> sum_;
};

struct rmsprop_options {
    double lr = 0.01, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0;
    bool centered = false;  ///< divide by the variance estimate (subtracting the mean gradient squared)
};

/// RMSprop (Hinton): step g / (√avg(g²) + eps), with momentum and the centered variant, as
/// torch.optim.RMSprop.
template <class T = float>
class rmsprop : public detail::optimizer<T, rmsprop_options> {
public:
    using C = compute_t<T>;  ///< state and update arithmetic (float for 16-bit parameters)

    rmsprop(std::vector<Tensor<T>> params, rmsprop_options o = {})
        : detail::optimizer<T, rmsprop_options>(std::move(params), o, "rmsprop"),
          square_avg_(detail::zeros_like_all(this->params_)),
          grad_avg_(o.centered ? detail::zeros_like_all(this->params_) : std::vector<Tensor<C>>{}),
          buffer_(o.momentum != 0 ? detail::zeros_like_all(this->params_) : std::vector<Tensor<C>>{}) {}
    void step() {
        const rmsprop_options& o = this->options_;
        // Averages move by 1 - alpha rounded to C (sq += (1 - a)(g² - sq)): alpha = 0.999 rounded to
        // float would decay them by 0.00099998713 instead of 0.001.
        const C lr = C(o.lr), k = C(1 - o.alpha), eps = C(o.eps), wd = C(o.weight_decay), mu = C(o.momentum);
        this->for_each_parameter([&](Tensor<C>& param, const Tensor<T>& g, std::size_t i) {
            // One loop per combination, each touching only the state it needs.
            auto average = [=]<class V>(V& p, V& d, V& sq) {
                d = d + V(wd) * p;
                sq = sq + V(k) * (d * d - sq);
            };
            auto apply = [=]<class V>(V& p, V d, V denominator, V* b) {
                if (b) {
                    *b = V(mu) * *b + d / denominator;
                    p = p - V(lr) * *b;
                } else {
                    p = p - V(lr) * d / denominator;
                }
            };
            if (o.centered && o.momentum != 0)
                detail::for_each_element(param, g, this->grad_scale(), [=]<class V>(V& p, V d, V& sq, V& ga, V& b) {
                    average(p, d, sq);
                    ga = ga + V(k) * (d - ga);
                    apply(p, d, math::sqrt(sq - ga * ga) + V(eps), &b);
                }, square_avg_[i], grad_avg_[i], buffer_[i]);
            else if (o.centered)
                detail::for_each_element(param, g, this->grad_scale(), [=]<class V>(V& p, V d, V& sq, V& ga) {
                    average(p, d, sq);
                    ga = ga + V(k) * (d - ga);
                    apply(p, d, math::sqrt(sq - ga * ga) + V(eps), static_cast<V*>(nullptr));
                }, square_avg_[i], grad_avg_[i]);
            else if (o.momentum != 0)
                detail::for_each_element(param, g, this->grad_scale(), [=]<class V>(V& p, V d, V& sq, V& b) {
                    average(p, d, sq);
                    apply(p, d, math::sqrt(sq) + V(eps), &b);
                }, square_avg_[i], buffer_[i]);
            else
                detail::for_each_element(param, g, this->grad_scale(), [=]<class V>(V& p, V d, V& sq) {
                    average(p, d, sq);
                    apply(p, d, math::sqrt(sq) + V(eps), static_cast<V*>(nullptr));
                }, square_avg_[i]);
        });
    }

    /// Calls f(name, tensor) for each state tensor (for checkpoints).
    template <class F>
    void for_each_state(F&& f) {
        this->visit_masters(f);
        this->visit_state(f, "square_avg", square_avg_);
        this->visit_state(f, "grad_avg", grad_avg_);
        this->visit_state(f, "momentum", buffer_);
    }

private:
    std::vector<Tensor<C>> square_avg_, grad_avg_, buffer_;
};

struct ftrl_options {
    double lr = 0.1;  ///< alpha
    double beta = 1, l1 = 0, l2 = 0;
};

/// FTRL-Proximal (McMahan et al. 2013), the per-coordinate optimizer of large sparse linear and
/// embedding models: L1 drives weights to exactly zero. State z and n (Σg²) per element.
template <class T = float>
class ftrl : public detail::optimizer<T, ftrl_options> {
public:
    using C = compute_t<T>;  ///< state and update arithmetic (float for 16-bit parameters)

    ftrl(std::vector<Tensor<T>> params, ftrl_options o = {})
        : detail::optimizer<T, ftrl_options>(std::move(params), o, "ftrl"),
          z_(detail::zeros_like_all(this->params_)),
          n_(detail::zeros_like_all(this->params_)) {
        if (!(o.lr > 0) || o.beta < 0 || o.l1 < 0 || o.l2 < 0)
            dl::detail::fail("dl::nn::ftrl: lr must be > 0 and beta, l1, l2 >= 0");
    }
    void step() {
        const ftrl_options& o = this->options_;
        const C inv_lr = C(1 / o.lr), beta = C(o.beta), l1 = C(o.l1), l2 = C(o.l2);
        this->for_each_parameter([&](Tensor<C>& param, const Tensor<T>& g, std::size_t i) {
            detail::for_each_element(param, g, this->grad_scale(), [=]<class V>(V& w, V d, V& z, V& n) {
                const V grown = n + d * d, root = math::sqrt(grown);
                z = z + d - (root - math::sqrt(n)) * V(inv_lr) * w;
                n = grown;
                const V shrunk = z - simd::copysign(V(l1), z);
                w = simd::select(simd::abs(z) <= V(l1), V(C(0)), -shrunk / ((V(beta) + root) * V(inv_lr) + V(l2)));
            }, z_[i], n_[i]);
        });
    }

    /// Calls f(name, tensor) for each state tensor (for checkpoints).
    template <class F>
    void for_each_state(F&& f) {
        this->visit_masters(f);
        this->visit_state(f, "z", z_);
        this->visit_state(f, "n", n_);
    }

private:
    std::vector<Tensor<C>> z_, n_;
};

// --- learning-rate schedules: each sets the optimizer's lr from the step count on step() ---

/// lr = base · gamma^⌊epoch / step_size⌋, as torch.optim.lr_scheduler.StepLR.
template <class Optimizer>
class step_lr {
public:
    step_lr(Optimizer& opt, std::int64_t step_size, double gamma = 0.1) : opt_(opt), base_(opt.lr()), size_(step_size), gamma_(gamma) {
        if (step_size <= 0) dl::detail::fail("dl::nn::step_lr: step_size must be positive, got ", step_size);
    }
    void step() { opt_.set_lr(base_ * std::pow(gamma_, static_cast<double>(++count_ / size_))); }

private:
    Optimizer& opt_;
    double base_;
    std::int64_t size_, count_ = 0;
    double gamma_;
};

/// Cosine annealing from the base lr to min_lr over `period` steps (then held), as
/// torch.optim.lr_scheduler.CosineAnnealingLR without restarts.
template <class Optimizer>
class cosine_lr {
public:
    cosine_lr(Optimizer& opt, std::int64_t period, double min_lr = 0) : opt_(opt), base_(opt.lr()), period_(period), min_(min_lr) {
        if (period <= 0) dl::detail::fail("dl::nn::cosine_lr: period must be positive, got ", period);
    }
    void step() {
        const double t = static_cast<double>(std::min(++count_, period_)) / static_cast<double>(period_);
        opt_.set_lr(min_ + (base_ - min_) * 0.5 * (1 + std::cos(std::numbers::pi * t)));
    }

private:
    Optimizer& opt_;
    double base_;
    std::int64_t period_, count_ = 0;
    double min_;
};

/// Linear warmup: lr rises from base · start_factor to base over `steps` steps, then stays.
template <class Optimizer>
class linear_warmup {
public:
    linear_warmup(Optimizer& opt, std::int64_t steps, double start_factor = 0.0)
        : opt_(opt), base_(opt.lr()), steps_(steps), start_(start_factor) {
        if (steps <= 0 || start_factor < 0 || start_factor > 1)
            dl::detail::fail("dl::nn::linear_warmup: steps must be positive and start_factor in [0, 1]");
        opt_.set_lr(base_ * start_);
    }
    void step() {
        const double t = static_cast<double>(std::min(++count_, steps_)) / static_cast<double>(steps_);
        opt_.set_lr(base_ * (start_ + (1 - start_) * t));
    }

private:
    Optimizer& opt_;
    double base_;
    std::int64_t steps_, count_ = 0;
    double start_;
};

}  // namespace dl::nn
