#pragma once
// The recorder that builds a Graph from the ops a Context runs (autograd/tracing.hpp), and splice(),
// which passes use to build replacement nodes the same way: by running the ops' own public functions
// while recording, so a rewritten graph holds op definitions too (DESIGN.md, principle 1).
#include <algorithm>
#include <map>
#include <optional>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "../autograd/node.hpp"
#include "executor.hpp"
#include "ir.hpp"

namespace dl::graph {

namespace detail {

/// Records ops into a Graph while attached to a Context.
class tracer final : public autograd::recorder {
public:
    explicit tracer(Graph& g) : graph_(g) {}

    int add_input(const any_tensor& t) {
        if (value_of(t) >= 0) dl::detail::fail("dl::graph::trace: the same tensor is passed as two inputs");
        value v{dtype_of_any(t), shape_of_any(t), shape_of_any(t).size() > 0, value_source::input, -1, {}};
        const int id = graph_.add_value(std::move(v));
        remember(t, id);
        graph_.inputs.push_back(id);
        return id;
    }

    /// Makes t stand for the existing value id (splice).
    void bind(const any_tensor& t, int id) { remember(t, id); }

    /// The value a tensor is: traced already, or a new parameter or constant.
    int value_for(const any_tensor& t) {
        if (const int id = value_of(t); id >= 0) return id;
        const bool parameter = std::visit(
            []<class V>(const V& x) {
                if constexpr (std::is_same_v<V, std::monostate>)
                    return false;
                else
                    return x.requires_grad();
            },
            t);
        value v{dtype_of_any(t), shape_of_any(t), false, parameter ? value_source::parameter : value_source::constant, -1, t};
        const int id = graph_.add_value(std::move(v));
        remember(t, id);
        return id;
    }

    void record(autograd::op_record&& op) override {
        node n;
        n.op = std::move(op.name);
        n.attributes = std::move(op.attributes);
        n.kind = op.kind;
        n.kernel = std::move(op.kernel);
        n.tile = std::move(op.tile);
        n.with_epilogue = std::move(op.with_epilogue);
        bool batched = false;
        for (const auto& in : op.inputs) {
            const int id = value_for(in);
            n.inputs.push_back(id);
            batched = batched || graph_.values[static_cast<std::size_t>(id)].batched;
        }
        const Shape& shape = shape_of_any(op.output);
        value v{dtype_of_any(op.output), shape, batched && shape.size() > 0 && shape[0] == graph_.batch, value_source::node,
                static_cast<int>(graph_.nodes.size()), {}};
        n.output = graph_.add_value(std::move(v));
        remember(op.output, n.output);
        graph_.nodes.push_back(std::move(n));
    }

    void check_write(const void* data, std::string_view op) const override {
        const auto* p = static_cast<const std::byte*>(data);
        for (const auto& [t, id] : examples_) {
            const auto* begin = static_cast<const std::byte*>(bytes_of_any(t));
            const auto bytes = static_cast<std::size_t>(graph_.values[static_cast<std::size_t>(id)].bytes());
            if (begin && p >= begin && p < begin + bytes && graph_.values[static_cast<std::size_t>(id)].source != value_source::constant)
                dl::detail::fail("dl::graph::trace: ", op, " into %", id,
                                 ", a traced value: a graph value never changes once made; compute a new tensor instead");
        }
    }

    [[nodiscard]] int value_of(const any_tensor& t) const {
        auto it = ids_.find(key_of(t));
        return it == ids_.end() ? -1 : it->second;
    }

private:
    using key = std::tuple<const void*, DType, std::vector<std::int64_t>>;
    [[nodiscard]] static key key_of(const any_tensor& t) {
        std::vector<std::int64_t> layout;
        std::visit(
            [&]<class V>(const V& x) {
                if constexpr (!std::is_same_v<V, std::monostate>) {
                    for (auto e : x.shape()) layout.push_back(e);
                    for (auto s : x.strides()) layout.push_back(s);
                }
            },
            t);
        return {bytes_of_any(t), dtype_of_any(t), std::move(layout)};
    }
    void remember(const any_tensor& t, int id) {
        ids_[key_of(t)] = id;
        // Holding every traced tensor keeps its block from being reused by a later tensor, which would
        // then look like this value.
        examples_.emplace_back(t, id);
    }

    Graph& graph_;
    std::map<key, int> ids_;
    std::vector<std::pair<any_tensor, int>> examples_;
};

/// Attaches a recorder to ctx, with gradients off, for its lifetime.
class recording {
public:
    recording(Context& ctx, autograd::recorder& r) : ctx_(ctx), off_(ctx) { ctx.set_recorder(&r); }
    recording(const recording&) = delete;
    recording& operator=(const recording&) = delete;
    ~recording() { ctx_.set_recorder(nullptr); }

private:
    Context& ctx_;
    no_grad off_;
};

}  // namespace detail

/// Records what make() executes as new nodes of g, placed before node `at`. Each bound tensor stands for
/// the value it is paired with (make reads it as that value; its contents do not matter, only its type);
/// tensors make reads that are not bound become constants, or parameters when they require grad. Returns
/// the value make's result is (make returns a tensor), or one value per tensor (make returns a vector of
/// them; -1 for a null tensor). Passes build replacement nodes this way, from the ops' public functions.
template <class Make>
auto splice(Graph& g, std::size_t at, Context& ctx, std::span<const std::pair<int, any_tensor>> bound, Make&& make) {
    if (ctx.recorder()) dl::detail::fail("dl::graph::splice: the Context is being traced");
    const std::size_t first = g.nodes.size();
    detail::tracer recorder(g);
    for (const auto& [id, t] : bound) recorder.bind(t, id);
    using result_t = std::invoke_result_t<Make&>;
    std::optional<result_t> result;
    {
        const detail::recording on(ctx, recorder);
        result.emplace(make());
    }
    auto ids = [&] {
        if constexpr (is_tensor_v<result_t>) {
            return recorder.value_for(any_tensor(*result));
        } else {
            std::vector<int> each;
            for (const auto& t : *result) each.push_back(t.defined() ? recorder.value_for(any_tensor(t)) : -1);
            return each;
        }
    }();
    std::rotate(g.nodes.begin() + static_cast<std::ptrdiff_t>(at), g.nodes.begin() + static_cast<std::ptrdiff_t>(first),
                g.nodes.end());
    g.reindex();
    return ids;
}

}  // namespace dl::graph
