#pragma once
// Flat compile-time composition: sequential<linear<>, relu, linear<>> runs its layers in order. The
// type lists the layers side by side, not nested, so it stays readable and cheap to compile.
#include <string>
#include <tuple>
#include <utility>

#include "layer.hpp"

namespace dl::nn {

template <class... Layers>
class sequential {
public:
    static_assert(sizeof...(Layers) > 0, "dl::nn::sequential: needs at least one layer");
    static_assert((layer<Layers> && ...), "dl::nn::sequential: every element must satisfy dl::nn::layer");

    explicit sequential(Layers... layers) : layers_(std::move(layers)...) {}

    template <class X>
    auto operator()(X&& x) {
        return run<0>(std::forward<X>(x));
    }

    /// Parameters are named "<index>.<name>", as PyTorch's nn.Sequential names them.
    template <class F>
    void for_each_parameter(F&& f) {
        [&]<std::size_t... I>(std::index_sequence<I...>) {
            (visit(f, std::to_string(I), std::get<I>(layers_)), ...);
        }(std::index_sequence_for<Layers...>{});
    }
    /// Buffers (running statistics) of the layers that have them, named like parameters.
    template <class F>
    void for_each_buffer(F&& f) {
        [&]<std::size_t... I>(std::index_sequence<I...>) {
            (visit_buffers(f, std::to_string(I), std::get<I>(layers_)), ...);
        }(std::index_sequence_for<Layers...>{});
    }
    void train(bool on = true) {
        std::apply([on](auto&... l) { (l.train(on), ...); }, layers_);
    }

    template <std::size_t I>
    [[nodiscard]] auto& get() noexcept {
        return std::get<I>(layers_);
    }
    static constexpr std::size_t size() noexcept { return sizeof...(Layers); }

private:
    template <std::size_t I, class X>
    auto run(X&& x) {
        constexpr std::size_t n = sizeof...(Layers);
        auto& layer = std::get<I>(layers_);
        if constexpr (I + 1 == n) {
            return layer(std::forward<X>(x));
        } else {
            // A product followed by an activation its epilogue can apply (linear, relu): one pass over
            // the output instead of two, forward and backward.
            using next = std::tuple_element_t<I + 1, std::tuple<Layers...>>;
            if constexpr (epilogue_of<next> != activation::none && takes_epilogue<decltype(layer), X>) {
                if (layer.epilogue() == activation::none) {
                    if constexpr (I + 2 == n)
                        return layer(x, epilogue_of<next>);
                    else
                        return run<I + 2>(layer(x, epilogue_of<next>));
                }
            }
            return run<I + 1>(layer(std::forward<X>(x)));
        }
    }

    std::tuple<Layers...> layers_;
};

/// Adds the input to what `body` computes: y = x + body(x).
template <class Body>
class residual {
public:
    explicit residual(Body body) : body_(std::move(body)) {}
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x) {
        Tensor<T> y = body_(x);
        return x + y;
    }
    template <class F>
    void for_each_parameter(F&& f) {
        visit(f, "body", body_);
    }
    template <class F>
    void for_each_buffer(F&& f) {
        visit_buffers(f, "body", body_);
    }
    void train(bool on = true) { body_.train(on); }

private:
    Body body_;
};

}  // namespace dl::nn
