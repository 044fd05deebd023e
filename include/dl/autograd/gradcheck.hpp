#pragma once
// gradcheck: compares the gradients backward computes with central finite differences, in double
// precision. A function with a non-scalar result is reduced with fixed pseudo-random weights r
// (checking Jᵀr, which is wrong with probability ~0 when any entry of J is wrong).
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "../core/random.hpp"
#include "reduce.hpp"

namespace dl::autograd {

struct gradcheck_options {
    double eps = 1e-6;   ///< finite-difference step
    double atol = 1e-5;  ///< |analytic - numeric| <= atol + rtol * |numeric|
    double rtol = 1e-4;
};

struct gradcheck_result {
    bool ok = true;
    std::string message;  ///< the first mismatch, or the largest error seen
    explicit operator bool() const noexcept { return ok; }
};

/// Checks d f(inputs...) / d inputs. f takes the inputs as Tensor<double> and returns a Tensor<double>;
/// the inputs are copied (contiguous, requiring grad), so the caller's tensors are not touched.
template <class F, class... In>
[[nodiscard]] gradcheck_result gradcheck(const gradcheck_options& options, F&& f, const In&... inputs) {
    static_assert(sizeof...(In) > 0 && (std::is_same_v<In, Tensor<double>> && ...),
                  "dl::gradcheck: inputs must be Tensor<double>, at least one");
    std::tuple<In...> leaves{inputs.detach().clone()...};
    std::apply([](auto&... t) { (t.requires_grad_(), ...); }, leaves);

    // Declared through In, so that these expressions depend on the template's arguments: written as
    // Tensor<double>, every file including dl.hpp compiled their sum and its backward (~0.4 s).
    using D = std::tuple_element_t<0, std::tuple<In...>>;
    D y = std::apply(f, leaves);
    // Weights in [0.5, 1.5) with random signs: no output is ignored, none dominates.
    D weights(y.shape(), y.context());
    for (std::int64_t i = 0; i < weights.numel(); ++i) {
        const double u = dl::detail::uniform_at(0x9e3779b9u, static_cast<std::uint64_t>(i));
        weights.data()[i] = (u < 0.5 ? -1.0 : 1.0) * (0.5 + 2.0 * std::abs(u - 0.5));
    }
    auto objective = [&] { return sum(std::apply(f, leaves) * weights).item(); };
    sum(y * weights).backward();

    gradcheck_result result;
    double worst = 0;
    std::ostringstream out;
    std::size_t input = 0;
    auto check_one = [&](Tensor<double>& x) {
        const Tensor<double> analytic = x.grad();
        no_grad off(x.context());
        for (std::int64_t i = 0; i < x.numel() && result.ok; ++i) {
            double& v = x.data()[i];
            const double saved = v;
            v = saved + options.eps;
            const double plus = objective();
            v = saved - options.eps;
            const double minus = objective();
            v = saved;
            const double numeric = (plus - minus) / (2 * options.eps);
            const double got = analytic.defined() ? analytic.data()[i] : 0.0;
            const double error = std::abs(got - numeric);
            worst = std::max(worst, error);
            if (!(error <= options.atol + options.rtol * std::abs(numeric))) {
                result.ok = false;
                out << "gradcheck: input " << input << " element " << i << ": backward gives " << got
                    << ", finite differences " << numeric << " (error " << error << ")";
            }
        }
        ++input;
    };
    std::apply([&](auto&... x) { (check_one(x), ...); }, leaves);
    if (result.ok) out << "gradcheck: ok, largest error " << worst;
    result.message = out.str();
    return result;
}

template <class F, class... In>
    requires(!std::is_same_v<std::remove_cvref_t<F>, gradcheck_options>)
[[nodiscard]] gradcheck_result gradcheck(F&& f, const In&... inputs) {
    return gradcheck(gradcheck_options{}, std::forward<F>(f), inputs...);
}

}  // namespace dl::autograd
