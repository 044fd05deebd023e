#pragma once
// Tracing: dl::graph::trace(f, example inputs...) runs f once with a recorder attached to the inputs'
// Context, so every op f executes records itself (autograd/tracing.hpp) into a Graph. Tensors f reads
// that no recorded op made are parameters (those that require grad, held by handle so training updates
// show) or constants. The result is a function: calling it runs the graph, on inputs of any batch size.
//
// Not traced: ops without a recorded kernel of their own that bypass the traced ones (none of the
// layers in nn/ do), writes into existing elements of traced values (an error), and control flow that
// depends on values (the graph keeps the path the example took). A tensor f creates with the batch
// size in its shape (an RNN's zero initial state) is a constant of the traced batch: such a graph runs
// at that batch size only.
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "executor.hpp"
#include "ir.hpp"
#include "passes.hpp"
#include "tracer.hpp"

namespace dl::graph {

/// A traced graph and what runs it. Not safe to run from two threads at once.
class function {
public:
    function(Graph g, Context& ctx) : graph_(std::move(g)), ctx_(&ctx) {}

    [[nodiscard]] const Graph& graph() const noexcept { return graph_; }
    [[nodiscard]] std::string to_string() const { return graph_.to_string(); }
    [[nodiscard]] Context& context() const noexcept { return *ctx_; }

    void set_strategy(strategy s) noexcept { strategy_ = s; }
    [[nodiscard]] strategy execution() const noexcept { return strategy_; }

    /// Runs the passes (default_passes() unless given) on the graph; returns their timings.
    std::vector<pass_timing> optimize(const pass_manager& passes = default_passes()) {
        auto timings = passes.run(graph_);
        executor_.clear();
        return timings;
    }
    /// Edits the graph with `edit(Graph&)` (a pass of one's own), then verifies it.
    template <class F>
    void transform(F&& edit) {
        edit(graph_);
        graph_.verify();
        executor_.clear();
    }

    /// Runs the whole graph on one tensor per graph input; returns the outputs.
    std::vector<any_tensor> run(std::span<const any_tensor> inputs) {
        if (inputs.size() != graph_.inputs.size())
            dl::detail::fail("dl::graph::function: the graph takes ", graph_.inputs.size(), " inputs, got ", inputs.size());
        feeds_.clear();
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            check_input(graph_.inputs[i], inputs[i]);
            feeds_.emplace_back(graph_.inputs[i], inputs[i]);
        }
        return executor_.run(graph_, *ctx_, feeds_, graph_.outputs, strategy_);
    }
    /// Feeds any values (inputs or intermediates: a fed value's producers do not run) and fetches any;
    /// only the nodes the fetches need run.
    std::vector<any_tensor> run(std::span<const std::pair<int, any_tensor>> feeds, std::span<const int> fetches) {
        for (const auto& [id, t] : feeds) {
            if (id < 0 || static_cast<std::size_t>(id) >= graph_.values.size())
                dl::detail::fail("dl::graph::function: feed of %", id, ", which does not exist");
            check_input(id, t);
        }
        return executor_.run(graph_, *ctx_, feeds, fetches, strategy_);
    }

private:
    void check_input(int id, const any_tensor& t) const {
        const value& v = graph_.values[static_cast<std::size_t>(id)];
        const Shape& shape = detail::shape_of_any(t);
        bool ok = t.index() != 0 && detail::dtype_of_any(t) == v.dtype && shape.size() == v.shape.size();
        for (int d = 0; ok && d < shape.size(); ++d) ok = shape[d] == v.shape[d] || (d == 0 && v.batched);
        if (!ok)
            dl::detail::fail("dl::graph::function: %", id, " is ", graph_.describe_type(id), ", got ",
                             t.index() ? dtype_name(detail::dtype_of_any(t)) : "no tensor", shape);
    }

    Graph graph_;
    Context* ctx_;
    strategy strategy_ = strategy::in_order;
    executor executor_;
    std::vector<std::pair<int, any_tensor>> feeds_;
};

/// A function whose call returns what the traced callable returned (a tensor, or a tuple of them).
template <class Result>
class traced : public function {
public:
    using function::function;
    /// A function (graph::load's) called as the traced callable was: its outputs as `Result`.
    explicit traced(function f) : function(std::move(f)) {}

    template <class... T>
    Result operator()(const Tensor<T>&... inputs) {
        const any_tensor in[] = {any_tensor(inputs)...};
        auto out = run(std::span<const any_tensor>(in, sizeof...(T)));
        if constexpr (is_tensor_v<Result>)
            return std::get<Result>(out.at(0));
        else
            return [&]<std::size_t... I>(std::index_sequence<I...>) {
                return Result{std::get<std::tuple_element_t<I, Result>>(out.at(I))...};
            }(std::make_index_sequence<std::tuple_size_v<Result>>{});
    }
};

namespace detail {
template <class R>
struct traced_result {
    using type = std::conditional_t<expression_node<R>, Tensor<value_t<R>>, R>;
};
template <class... R>
struct traced_result<std::tuple<R...>> {
    using type = std::tuple<typename traced_result<R>::type...>;
};
}  // namespace detail

/// Records what f(inputs...) executes (inputs: tensors, the first one's dimension 0 the batch) into a
/// graph. Calling the result runs the graph; the traced graph is not optimised yet (see optimize()).
template <class F, class... T>
[[nodiscard]] auto trace(F&& f, const Tensor<T>&... inputs) {
    static_assert(sizeof...(T) > 0, "dl::graph::trace: needs at least one example input");
    using raw = std::remove_cvref_t<std::invoke_result_t<F&, const Tensor<T>&...>>;
    using result = typename detail::traced_result<raw>::type;
    Context& ctx = std::get<0>(std::tie(inputs...)).context();
    if (ctx.recorder()) dl::detail::fail("dl::graph::trace: the Context is already being traced");
    Graph g;
    g.batch = std::get<0>(std::tie(inputs...)).rank() > 0 ? std::get<0>(std::tie(inputs...)).shape()[0] : 0;
    detail::tracer recorder(g);
    (recorder.add_input(any_tensor(inputs)), ...);
    {
        const detail::recording on(ctx, recorder);
        auto add_output = [&]<class R>(const R& r) {
            const Tensor<value_t<R>> t = r;  // an expression still unevaluated records here
            g.outputs.push_back(recorder.value_for(any_tensor(t)));
        };
        raw out = f(inputs...);
        if constexpr (requires { std::tuple_size<raw>::value; })
            std::apply([&](const auto&... r) { (add_output(r), ...); }, out);
        else
            add_output(out);
    }
    g.verify();
    return traced<result>(std::move(g), ctx);
}

}  // namespace dl::graph
