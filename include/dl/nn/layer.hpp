#pragma once
// The layer contract. A layer is a type that
//  - declares its parameters at construction (or at its first call, when an input size is inferred),
//  - computes in its call operator (forward is execution; autograd records what it does),
//  - shows its parameters as (name, tensor) pairs through for_each_parameter, nested layers with a
//    "name." prefix, so optimizers and checkpoints see every one,
//  - switches between training and evaluation behaviour with train(bool).
// Layers nest; a model is a layer. Sequential composition is flat: sequential<linear, relu, linear>.
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "../autograd/linalg.hpp"
#include "../core/creation.hpp"

namespace dl::nn {

namespace detail {
/// Stands for any visitor in the layer concept: called as f(name, tensor).
struct parameter_visitor {
    template <class T>
    void operator()(std::string_view, Tensor<T>&) const {}
};
}  // namespace detail

template <class L>
concept layer = requires(L& l, detail::parameter_visitor f, bool on) {
    l.for_each_parameter(f);
    l.train(on);
};

/// The activation a product's epilogue can apply in place of layer L (relu, tanh, sigmoid, gelu
/// specialise it, in layers.hpp); none for every other layer.
template <class L>
inline constexpr activation epilogue_of = activation::none;

/// A product layer (linear, conv2d) that can run the activation after it in its epilogue:
/// l(x, act) is act(l(x)) in one pass over the output, and l.epilogue() is the activation it applies
/// already (none, or the one its options name), which leaves no room for another.
template <class L, class X>
concept takes_epilogue = requires(L& l, const X& x) {
    { l.epilogue() } -> std::same_as<activation>;
    l(x, activation::relu);
};

namespace detail {
/// f, with every name it receives prefixed by "<prefix>.".
template <class F>
[[nodiscard]] auto prefixed(F& f, std::string_view prefix) {
    return [&f, prefix](std::string_view name, auto& t) {
        std::string full;
        full.reserve(prefix.size() + 1 + name.size());
        full.append(prefix).append(".").append(name);
        f(std::string_view(full), t);
    };
}
}  // namespace detail

/// Visits the parameters of `child` as "<prefix>.<name>": for user structs with layer members.
template <class F, layer L>
void visit(F&& f, std::string_view prefix, L& child) {
    child.for_each_parameter(detail::prefixed(f, prefix));
}

/// Visits the buffers (running statistics, for checkpoints) of `child`, when it has any, as
/// "<prefix>.<name>". A user struct holding layers with buffers gives itself a for_each_buffer
/// that calls this for each member, as sequential does.
template <class F, layer L>
void visit_buffers(F&& f, std::string_view prefix, L& child) {
    if constexpr (requires { child.for_each_buffer(f); }) child.for_each_buffer(detail::prefixed(f, prefix));
}

/// The float parameters of a layer, as handles sharing storage and gradient with the layer's own.
template <class T = float, layer L>
[[nodiscard]] std::vector<Tensor<T>> parameters(L& model) {
    std::vector<Tensor<T>> out;
    model.for_each_parameter([&](std::string_view, auto& t) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(t)>, Tensor<T>>) out.push_back(t);
    });
    return out;
}

/// Number of scalar parameters.
template <layer L>
[[nodiscard]] std::int64_t parameter_count(L& model) {
    std::int64_t n = 0;
    model.for_each_parameter([&](std::string_view, const auto& t) { n += t.numel(); });
    return n;
}

/// Layers without parameters or modes derive from this.
struct stateless {
    template <class F>
    void for_each_parameter(F&&) {}
    void train(bool = true) {}
};

/// Checks an input's shape for a layer: rank, and the extent of one dimension when expected >= 0.
/// `expected_text()` describes the expected shape; it is only called for the error message, so a layer
/// called at batch 1 in a loop does not format a string every time.
template <class T, std::invocable Describe>
void check_input(const Tensor<T>& x, std::string_view layer_name, int rank, int dim, std::int64_t expected,
                 Describe&& expected_text) {
    if (x.rank() != rank || (expected >= 0 && x.shape()[dim] != expected))
        dl::detail::fail("dl::nn::", layer_name, ": expected input ", expected_text(), ", got shape ", x.shape());
}

}  // namespace dl::nn
