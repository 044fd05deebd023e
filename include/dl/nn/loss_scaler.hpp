#pragma once
// Dynamic loss scaling for float16 training, as torch.cuda.amp.GradScaler. float16's smallest
// subnormal is 6e-8, so small gradients flush to zero; backpropagating from loss · scale lifts them
// into range, and the optimizer divides the scale out again in float (its gradient multiplier, see
// optim.hpp) before it touches the float master weights. The scale doubles after growth_interval
// clean steps; a step whose gradients hold Inf or NaN is skipped and the scale halved.
// bfloat16 has float's exponent range and does not need this.
#include <cstdint>

#include "../autograd/reduce.hpp"
#include "../core/creation.hpp"
#include "../expr/operators.hpp"

namespace dl::nn {

struct loss_scaler_options {
    double initial_scale = 32768;  ///< 2^15: 1 · 2^16 would already be Inf in float16
    double growth_factor = 2, backoff_factor = 0.5;
    std::int64_t growth_interval = 2000;
};

class loss_scaler {
public:
    explicit loss_scaler(loss_scaler_options o = {}) : options_(o), scale_(o.initial_scale) {
        if (!(o.initial_scale > 0) || !(o.growth_factor >= 1) || !(o.backoff_factor > 0 && o.backoff_factor < 1) ||
            o.growth_interval <= 0)
            dl::detail::fail("dl::nn::loss_scaler: need initial_scale > 0, growth_factor >= 1, backoff_factor in (0, 1) "
                             "and growth_interval > 0");
    }

    /// Backpropagates from `loss` (a scalar) with the output gradient `scale` instead of 1, so the
    /// scaled loss itself (which may not fit in float16) is never formed.
    template <class T>
    void backward(const Tensor<T>& loss, bool retain_graph = false) const {
        if (loss.numel() != 1) dl::detail::fail("dl::nn::loss_scaler::backward: the loss must be a scalar, got shape ", loss.shape());
        loss.backward(full<T>(loss.shape(), scale_, loss.context()), retain_graph);
    }

    /// Steps `opt` with the scale divided out of the gradients, unless a gradient is Inf or NaN: then
    /// the step is skipped (parameters and optimizer state untouched). Updates the scale either way.
    /// Returns whether the optimizer stepped.
    template <class Optimizer>
    bool step(Optimizer& opt) {
        bool finite = true;
        for (const auto& p : opt.params())
            if (const auto g = p.grad(); g.defined() && finite) finite = dl::all(dl::isfinite(g)).item();
        if (!finite) {
            scale_ *= options_.backoff_factor;
            clean_steps_ = 0;
            ++skipped_;
            return false;
        }
        opt.set_grad_scale(1 / scale_);
        opt.step();
        opt.set_grad_scale(1);
        if (++clean_steps_ == options_.growth_interval) {
            scale_ *= options_.growth_factor;
            clean_steps_ = 0;
        }
        return true;
    }

    [[nodiscard]] double scale() const noexcept { return scale_; }
    /// Steps skipped so far for Inf/NaN gradients.
    [[nodiscard]] std::int64_t skipped_steps() const noexcept { return skipped_; }

private:
    loss_scaler_options options_;
    double scale_;
    std::int64_t clean_steps_ = 0, skipped_ = 0;
};

}  // namespace dl::nn
