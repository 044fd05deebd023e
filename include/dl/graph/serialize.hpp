#pragma once
// Export for serving: save(graph, path) writes a traced graph (optimised or not) with its parameters
// and constants as one safetensors file, and load(path, ctx) reads it back, so a C++ service runs a
// model without its source. The tensors are named "%<value id>"; the graph itself is JSON in the
// header's metadata under "dl.graph" (format "dl.graph", version 1), so safetensors tools still read
// the weights. The weights carry the CRC32C every dl safetensors file has (nn/checkpoint.hpp); the
// graph text carries its own under "dl.graph.crc32c", so that a flipped attribute or extent is an
// error rather than another model. load() checks both when present (files written before them load).
//
// A file holds op names and attributes, never code. load() rebuilds each node's kernel from the op's
// own definition (DESIGN.md, principle 1): it calls the op's public function once on zero-filled
// tensors of the node's input types while recording, and checks that the op recorded is the one saved,
// attributes included, with the saved result type. Those stand-ins have the shapes the file declares,
// which its bytes do not back, so load_options bounds what they may take. Elementwise nodes and the
// steps of fused nodes get their tile kernels from the functors of expr/functors.hpp, found by name.
//
// Not saved (save() refuses, naming the node): graphs being trained (vjp and allreduce nodes),
// effectful ops (dropout, batch_norm in training mode), int8-quantized ops (their weights are not
// tensors: quantize after loading), and elementwise ops over integer tensors other than casts.
//
// A template only so that the rebuild tables (every functor over every floating dtype) compile in the
// files that load graphs, not in every includer.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../autograd/conv.hpp"
#include "../autograd/elementwise.hpp"
#include "../autograd/indexing.hpp"
#include "../autograd/linalg.hpp"
#include "../autograd/normalization.hpp"
#include "../autograd/reduce.hpp"
#include "../autograd/softmax.hpp"
#include "../autograd/views.hpp"
#include "../core/crc32c.hpp"
#include "../io/safetensors.hpp"
#include "inference.hpp"
#include "trace.hpp"

namespace dl::graph {

namespace detail {

inline constexpr int graph_format_version = 1;
inline constexpr std::string_view graph_crc_key = "dl.graph.crc32c";

/// f(std::type_identity<T>{}) for the element type T of dtype d.
template <class F>
decltype(auto) with_dtype(DType d, F&& f) {
    switch (d) {
        case DType::boolean: return f(std::type_identity<bool>{});
        case DType::uint8: return f(std::type_identity<std::uint8_t>{});
        case DType::int32: return f(std::type_identity<std::int32_t>{});
        case DType::int64: return f(std::type_identity<std::int64_t>{});
        case DType::float32: return f(std::type_identity<float>{});
        case DType::float64: return f(std::type_identity<double>{});
        case DType::bfloat16: return f(std::type_identity<bfloat16>{});
        case DType::float16: return f(std::type_identity<float16>{});
    }
    dl::detail::fail("dl::graph: unknown dtype ", static_cast<int>(d));
}

// --- elementwise ops: tile kernels from the functors, by name ---

using ops::binary_functors;
using ops::listed;
using ops::logical_functors;
using ops::op_list;
using ops::unary_functors;

[[nodiscard]] inline bool rebuildable_elementwise(std::string_view name) {
    return listed(unary_functors{}, name) || listed(binary_functors{}, name) || listed(logical_functors{}, name) ||
           name == ops::logical_not::name || name == ops::where::name || name == ops::clamp::name ||
           name == "cast";
}

/// An elementwise op as a file describes it: the functor's name and attributes, its tensor operands'
/// dtypes in order, and its result's dtype.
struct elementwise_signature {
    std::string_view op;
    std::string_view attributes;
    std::vector<DType> operands;
    DType result;
    std::string_view where;  ///< for errors: "node 3"
};

[[noreturn]] inline void cannot_rebuild(const elementwise_signature& s, std::string_view why) {
    std::string types;
    for (DType d : s.operands) types += (types.empty() ? "" : ", ") + std::string(dtype_name(d));
    dl::detail::fail("dl::graph::load: ", s.where, " (", s.op, " {", s.attributes, "} over ", types, " to ",
                     dtype_name(s.result), "): ", why);
}

template <class V>
using tensor_slot = autograd::detail::argument_slot<Tensor<V>>;
template <class V>
using scalar_slot = autograd::detail::argument_slot<scalar_node<V>>;
template <class S>
inline constexpr bool is_scalar_slot = !is_tensor_v<std::remove_cvref_t<decltype(std::declval<S>().get({}))>>;

/// The tile kernel of op over operands `slots` (tensor slots index the tile operands).
template <class Op, class... Slots>
[[nodiscard]] tile_kernel tile_of(const Op& op, const elementwise_signature& s, Slots... slots) {
    if constexpr ((is_scalar_slot<Slots> && ...)) {
        cannot_rebuild(s, "no operand is a tensor");
    } else {
        using R = value_t<fn_node<Op, std::remove_cvref_t<decltype(slots.get({}))>...>>;
        if (dtype_of<R> != s.result) cannot_rebuild(s, "the functor makes another dtype");
        return {[op, tuple = std::tuple{slots...}](const tile_operand* in, void* out, std::int64_t count) {
                    autograd::detail::run_tile<R, Op>(op, static_cast<R*>(out), count, in, tuple);
                },
                Op::cost};
    }
}

/// Calls k with the slot of the next operand: the scalar `value` (element type V) when it has one, else
/// the next tensor operand.
template <class V, class K>
[[nodiscard]] tile_kernel operand_slot(const std::optional<double>& value, int& next_tensor, K&& k) {
    if (value) return k(scalar_slot<V>{scalar_node<V>{{}, static_cast<compute_t<V>>(*value)}});
    return k(tensor_slot<V>{next_tensor++});
}

/// The functor `Op` with the parameters its attributes give.
template <class Op>
[[nodiscard]] Op functor_of(const elementwise_signature& s) {
    Op op{};
    if constexpr (requires { op.slope; }) op.slope = parse_attribute<double>(s.op, s.attributes, "slope");
    if constexpr (requires { op.alpha; }) op.alpha = parse_attribute<double>(s.op, s.attributes, "alpha");
    return op;
}

template <class... Op, class F>
[[nodiscard]] bool find_functor(op_list<Op...>, std::string_view name, F&& f) {
    return ((Op::name == name && (f(std::type_identity<Op>{}), true)) || ...);
}

/// Calls f(std::type_identity<T>{}) when dtype d is one of Types (the floating types a load compiles
/// in); fails naming the node otherwise.
template <class... Types, class F>
[[nodiscard]] decltype(auto) with_compiled_dtype(DType d, std::string_view where, std::string_view op, F&& f) {
    return with_dtype(d, [&]<class T>(std::type_identity<T> t) -> decltype(f(std::type_identity<float>{})) {
        if constexpr ((std::is_same_v<T, Types> || ...)) {
            return f(t);
        } else {
            std::string listed;
            ((listed += (listed.empty() ? "" : ", ") + std::string(dtype_name(dtype_of<Types>))), ...);
            dl::detail::fail("dl::graph::load: ", where, " (", op, ") computes in ", dtype_name(d),
                             is_floating_element<T> ? "; this load was compiled for " : ", which dl loads for casts only; this load was compiled for ",
                             listed, is_floating_element<T> ? " (list it: dl::graph::load<float, dl::bfloat16, ...>(path))" : "");
        }
    });
}

/// The tile kernel of an elementwise op the file names. Its tensor operands share one floating dtype
/// among Types (bool for logical ops; where's condition is bool; a cast converts between any two
/// dtypes); scalar operands ("s<position>=value" attributes) have that dtype, as a traced expression
/// gives them.
template <class... Types>
[[nodiscard]] tile_kernel elementwise_tile(const elementwise_signature& s) {
    constexpr int max_arity = 3;
    std::array<std::optional<double>, max_arity> scalars;
    int arity = static_cast<int>(s.operands.size());
    for (int p = 0; p < max_arity; ++p)
        if (const std::string_view text = attribute(s.attributes, "s" + std::to_string(p)); !text.empty()) {
            scalars[static_cast<std::size_t>(p)] = parse_attribute<double>(s.op, s.attributes, "s" + std::to_string(p));
            ++arity;
        }
    if (s.operands.empty()) cannot_rebuild(s, "no operand is a tensor");
    if (s.op == "cast") {
        if (arity != 1) cannot_rebuild(s, "a cast has one operand");
        return with_dtype(s.operands[0], [&]<class From>(std::type_identity<From>) {
            return with_dtype(s.result, [&]<class To>(std::type_identity<To>) -> tile_kernel {
                if constexpr (std::is_same_v<From, To>)
                    cannot_rebuild(s, "a cast to the same dtype");
                else
                    return tile_of(ops::cast<To>{}, s, tensor_slot<From>{0});
            });
        });
    }
    const bool is_where = s.op == ops::where::name;
    // The dtype the operands share (where: its value operands).
    DType shared = s.operands[is_where && s.operands.size() > 1 ? 1 : 0];
    for (std::size_t i = is_where ? 1 : 0; i < s.operands.size(); ++i)
        if (s.operands[i] != shared) cannot_rebuild(s, "its tensor operands have different dtypes");
    if (is_where && s.operands[0] != DType::boolean) cannot_rebuild(s, "the condition of where must be bool");
    if (is_where && s.operands.size() == 1) shared = s.result;
    int next = 0;
    auto floating = [&](auto&& build) -> tile_kernel {
        return with_compiled_dtype<Types...>(shared, s.where, s.op, [&]<class T>(std::type_identity<T> t) { return build(t); });
    };
    auto expect_arity = [&](int n) {
        if (arity != n) cannot_rebuild(s, dl::detail::concat("the op takes ", n, " operands, the file gives ", arity));
    };
    std::optional<tile_kernel> found;
    if (find_functor(unary_functors{}, s.op, [&]<class Op>(std::type_identity<Op>) {
            expect_arity(1);
            if (scalars[0]) cannot_rebuild(s, "no operand is a tensor");
            found = floating([&]<class T>(std::type_identity<T>) { return tile_of(functor_of<Op>(s), s, tensor_slot<T>{0}); });
        }))
        return *found;
    if (find_functor(binary_functors{}, s.op, [&]<class Op>(std::type_identity<Op>) {
            expect_arity(2);
            found = floating([&]<class T>(std::type_identity<T>) {
                return operand_slot<T>(scalars[0], next, [&](auto a) {
                    return operand_slot<T>(scalars[1], next, [&](auto b) { return tile_of(Op{}, s, a, b); });
                });
            });
        }))
        return *found;
    if (s.op == ops::where::name || s.op == ops::clamp::name) {
        expect_arity(3);
        if (scalars[0]) cannot_rebuild(s, "its first operand must be a tensor");
        return floating([&]<class T>(std::type_identity<T>) {
            auto third = [&](auto first, auto second) {
                return operand_slot<T>(scalars[2], next, [&](auto c) -> tile_kernel {
                    if (s.op == ops::where::name)
                        return tile_of(ops::where{}, s, first, second, c);
                    return tile_of(ops::clamp{}, s, first, second, c);
                });
            };
            if (s.op == ops::where::name) {
                const tensor_slot<bool> condition{next++};
                return operand_slot<T>(scalars[1], next, [&](auto b) { return third(condition, b); });
            }
            const tensor_slot<T> x{next++};
            return operand_slot<T>(scalars[1], next, [&](auto lo) { return third(x, lo); });
        });
    }
    if (shared != DType::boolean) cannot_rebuild(s, "logical ops take bool tensors");
    if (s.op == ops::logical_not::name) {
        expect_arity(1);
        return tile_of(ops::logical_not{}, s, tensor_slot<bool>{0});
    }
    if (find_functor(logical_functors{}, s.op, [&]<class Op>(std::type_identity<Op>) {
            expect_arity(2);
            found = operand_slot<bool>(scalars[0], next, [&](auto a) {
                return operand_slot<bool>(scalars[1], next, [&](auto b) { return tile_of(Op{}, s, a, b); });
            });
        }))
        return *found;
    cannot_rebuild(s, "dl has no elementwise op of that name");
}

/// The kernel of a loaded elementwise node: its tile kernel run as a chain of one step (operands
/// broadcast, the pool's threads over tiles), as a traced one runs.
[[nodiscard]] inline op_kernel tile_node_kernel(const node& n, DType result) {
    return autograd::detail::step_kernel(n.op, n.attributes, n.inputs.size(), result, n.tile);
}

// --- every other op: its public function, called while recording ---

/// Keeps the ops a Context records.
class op_capture final : public autograd::recorder {
public:
    std::vector<autograd::op_record> ops;
    void record(autograd::op_record&& op) override { ops.push_back(std::move(op)); }
    void check_write(const void*, std::string_view) const override {}
};

/// The ops other than elementwise ones that call_op rebuilds (keep the two in step: save() checks a
/// graph against this list, so that it never writes a file load() refuses).
inline constexpr std::string_view rebuildable_ops[] = {
    "slice", "select", "transpose", "permute", "reshape", "expand", "clone", "matmul", "linear", "conv2d",
    "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "softmax", "log_softmax", "layer_norm", "batch_norm", "sum",
    "mean", "prod", "max", "min", "logsumexp", "var", "std", "norm", "argmax", "argmin", "any", "all",
    "index_select", "gather", "scatter", "scatter_add", "embedding_bag", "cat", "stack"};

[[nodiscard]] inline bool rebuildable_op(std::string_view name) {
    return std::find(std::begin(rebuildable_ops), std::end(rebuildable_ops), name) != std::end(rebuildable_ops);
}

/// Runs node n's op, by its public function, on `in` (one tensor per node input). Ops that compute
/// are compiled for the floating Types only: conv2d alone takes g++ seconds per dtype.
template <class... Types>
[[nodiscard]] any_tensor call_op(const node& n, std::string_view where, std::span<const any_tensor> in) {
    const std::string_view op = n.op;
    auto input = [&]<class T>(std::type_identity<T>, std::size_t i) -> Tensor<T> {
        if (i >= in.size()) return {};
        const auto* t = std::get_if<Tensor<T>>(&in[i]);
        if (!t)
            dl::detail::fail("dl::graph::load: ", where, " (", op, ") reads ", dtype_name(dtype_of_any(in[i])), " as input ", i,
                             ", expected ", dtype_name(dtype_of<T>));
        return *t;
    };
    auto index_of = [&](std::size_t i, auto&& f) -> any_tensor {
        if (i < in.size() && std::holds_alternative<Tensor<std::int32_t>>(in[i])) return f(std::get<Tensor<std::int32_t>>(in[i]));
        if (i < in.size() && std::holds_alternative<Tensor<std::int64_t>>(in[i])) return f(std::get<Tensor<std::int64_t>>(in[i]));
        dl::detail::fail("dl::graph::load: ", where, " (", op, ") needs an int32 or int64 index as input ", i);
    };
    const auto arity = in.size();
    auto dims = [&](std::string_view key) { return parse_dims(n, key); };
    auto integer = [&](std::string_view key) { return parse_attribute<std::int64_t>(n, key); };
    auto real = [&](std::string_view key) { return parse_attribute<double>(n, key); };
    auto flag = [&](std::string_view key) { return parse_attribute<bool>(n, key); };
    auto act = [&] {
        const int a = parse_attribute<int>(n, "act");
        if (a < 0 || a > static_cast<int>(activation::tanh))
            dl::detail::fail("dl::graph::load: ", where, " (", op, ") has an unknown activation ", a);
        return static_cast<activation>(a);
    };
    auto pool = [&] {
        return pool2d_options{parse_extent(n, "kernel"), parse_extent(n, "stride"), parse_extent(n, "padding"),
                              flag("count_include_pad")};
    };
    const DType first = in.empty() ? DType::float32 : dtype_of_any(in[0]);

    // Views, cat and stack: any dtype.
    auto any_type = [&](auto&& f) -> any_tensor {
        return with_dtype(first, [&]<class T>(std::type_identity<T> t) -> any_tensor { return f(t); });
    };
    if (op == "slice" || op == "select" || op == "transpose" || op == "permute" || op == "reshape" || op == "expand" ||
        op == "clone")
        return any_type([&]<class T>(std::type_identity<T> t) -> any_tensor {
            const Tensor<T> x = input(t, 0);
            if (op == "reshape") return x.reshape(dims("shape"));
            if (op == "expand") return x.expand(dims("shape"));
            if (op == "clone") return x.clone();
            const Dims a = dims("args");
            auto need = [&](int count) {
                if (a.size() != count) dl::detail::fail("dl::graph::load: ", where, " (", op, ") needs ", count, " arguments, got {", n.attributes, "}");
            };
            if (op == "slice") return need(4), x.slice(a[0], a[1], a[2], a[3]);
            if (op == "select") return need(2), x.select(a[0], a[1]);
            if (op == "transpose") return need(2), x.transpose(a[0], a[1]);
            return x.permute(a);
        });
    if (op == "cat" || op == "stack")
        return any_type([&]<class T>(std::type_identity<T> t) -> any_tensor {
            std::vector<Tensor<T>> parts;
            for (std::size_t i = 0; i < arity; ++i) parts.push_back(input(t, i));
            return op == "cat" ? cat(parts, integer("dim")) : stack(parts, integer("dim"));
        });
    if (op == "any" || op == "all") {
        const Tensor<bool> x = input(std::type_identity<bool>{}, 0);
        return op == "any" ? dl::any(x, dims("axes"), flag("keepdim")) : dl::all(x, dims("axes"), flag("keepdim"));
    }
    // Everything else computes on floating tensors.
    return with_compiled_dtype<Types...>(first, where, op, [&]<class T>(std::type_identity<T> t) -> any_tensor {
        {
            auto x = [&](std::size_t i) { return input(t, i); };
            if (op == "matmul") return matmul(x(0), x(1));
            if (op == "linear") return linear(x(0), x(1), x(2), act());
            if (op == "conv2d")
                return conv2d(x(0), x(1), x(2),
                              conv2d_options{parse_extent(n, "stride"), parse_extent(n, "padding"), parse_extent(n, "dilation"),
                                             integer("groups"), act(), attribute(n, "max_pool").empty() ? 0 : integer("max_pool")});
            if (op == "max_pool2d") return max_pool2d(x(0), pool());
            if (op == "avg_pool2d") return avg_pool2d(x(0), pool());
            if (op == "adaptive_avg_pool2d") return adaptive_avg_pool2d(x(0), parse_extent(n, "output"));
            if (op == "softmax") return softmax(x(0), integer("dim"));
            if (op == "log_softmax") return log_softmax(x(0), integer("dim"));
            // Optional weight and bias: with one of the two, the file cannot tell which; it is the weight.
            if (op == "layer_norm") return layer_norm(x(0), static_cast<int>(integer("dims")), x(1), x(2), real("eps"));
            if (op == "batch_norm") {
                if (flag("training")) dl::detail::fail("dl::graph::load: ", where, " (batch_norm) is in training mode");
                return batch_norm(x(0), x(1), x(2), x(3), x(4), false, real("momentum"), real("eps"));
            }
            if (op == "sum") return dl::sum(x(0), dims("axes"), flag("keepdim"));
            if (op == "mean") return dl::mean(x(0), dims("axes"), flag("keepdim"));
            if (op == "prod") return dl::prod(x(0), dims("axes"), flag("keepdim"));
            if (op == "max") return dl::max(x(0), dims("axes"), flag("keepdim"));
            if (op == "min") return dl::min(x(0), dims("axes"), flag("keepdim"));
            if (op == "logsumexp") return dl::logsumexp(x(0), dims("axes"), flag("keepdim"));
            if (op == "var") return dl::var(x(0), dims("axes"), flag("keepdim"), real("correction"));
            if (op == "std") return dl::std(x(0), dims("axes"), flag("keepdim"), real("correction"));
            if (op == "norm") return dl::norm(x(0), real("p"), dims("axes"), flag("keepdim"));
            if (op == "argmax" || op == "argmin") {
                if (n.attributes.empty()) return op == "argmax" ? dl::argmax(x(0)) : dl::argmin(x(0));
                return op == "argmax" ? dl::argmax(x(0), integer("axis"), flag("keepdim"))
                                      : dl::argmin(x(0), integer("axis"), flag("keepdim"));
            }
            if (op == "index_select") return index_of(1, [&](const auto& i) { return any_tensor(index_select(x(0), integer("dim"), i)); });
            if (op == "gather") return index_of(1, [&](const auto& i) { return any_tensor(gather(x(0), integer("dim"), i)); });
            if (op == "scatter") return index_of(1, [&](const auto& i) { return any_tensor(scatter(x(0), integer("dim"), i, x(2))); });
            if (op == "scatter_add")
                return index_of(1, [&](const auto& i) { return any_tensor(scatter_add(x(0), integer("dim"), i, x(2))); });
            if (op == "embedding_bag")
                return index_of(1, [&]<class I>(const Tensor<I>& ids) {
                    return any_tensor(embedding_bag(x(0), ids, std::get<Tensor<I>>(in[2]),
                                                    static_cast<bag_mode>(integer("mode")), x(3)));
                });
            dl::detail::fail("dl::graph::load: ", where, ": dl cannot rebuild op ", op);
        }
    });
}

[[nodiscard]] inline std::string_view kind_name(op_kind k) {
    switch (k) {
        case op_kind::elementwise: return "elementwise";
        case op_kind::view: return "view";
        case op_kind::pure: return "pure";
        case op_kind::effectful: return "effectful";
    }
    return "?";
}
[[nodiscard]] inline std::string_view source_name(value_source s) {
    switch (s) {
        case value_source::input: return "input";
        case value_source::parameter: return "parameter";
        case value_source::constant: return "constant";
        case value_source::node: return "node";
    }
    return "?";
}

/// Why node n cannot be saved, or empty.
[[nodiscard]] inline std::string unsaveable(const node& n) {
    if (n.kind == op_kind::effectful)
        return "it has effects (random numbers or state updates); trace the model in evaluation mode";
    if (n.op.starts_with("quantized_"))
        return "its int8 weights are not tensors; save the float graph and quantize after loading";
    if (n.op == "vjp" || n.op == "vjp_part" || n.op == "allreduce")
        return "it belongs to a graph being trained; save the inference graph, before differentiate";
    if (n.fused()) {
        for (const fused_step& step : n.steps)
            if (!rebuildable_elementwise(step.op)) return "its step " + step.op + " is not an elementwise op dl can rebuild";
        return {};
    }
    if (n.kind == op_kind::elementwise ? !rebuildable_elementwise(n.op) : !rebuildable_op(n.op))
        return "dl cannot rebuild this op from its name";
    return {};
}

template <class... Parts>
[[noreturn]] void load_failure(const std::string& path, const Parts&... parts) {
    dl::detail::fail("dl::graph::load: ", path, ": ", parts...);
}

[[nodiscard]] inline std::string tensor_name(int id) { return "%" + std::to_string(id); }

}  // namespace detail

/// Writes g (verified first), its parameters and its constants to `path` (through a temporary file,
/// renamed at the end). Fails, naming the node, for graphs holding ops that cannot be rebuilt (above).
template <class = void>
void save(const Graph& g, const std::filesystem::path& path) {
    using nlohmann::json;
    g.verify();
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
        if (const std::string why = detail::unsaveable(g.nodes[i]); !why.empty())
            dl::detail::fail("dl::graph::save: node ", i, " (", g.nodes[i].op, ") cannot be saved: ", why);
    nn::safetensors_writer writer;
    json values = json::array();
    for (int id = 0; id < static_cast<int>(g.values.size()); ++id) {
        const value& v = g.values[static_cast<std::size_t>(id)];
        values.push_back({{"dtype", dtype_name(v.dtype)},
                          {"shape", std::vector<std::int64_t>(v.shape.begin(), v.shape.end())},
                          {"batched", v.batched},
                          {"source", detail::source_name(v.source)}});
        if (v.source == value_source::parameter || v.source == value_source::constant)
            std::visit(
                [&]<class V>(const V& t) {
                    if constexpr (!std::is_same_v<V, std::monostate>) writer.add(detail::tensor_name(id), t);
                },
                v.data);
    }
    json nodes = json::array();
    for (const node& n : g.nodes) {
        json steps = json::array();
        for (const fused_step& s : n.steps)
            steps.push_back({{"op", s.op}, {"attributes", s.attributes}, {"inputs", s.inputs}, {"dtype", dtype_name(s.dtype)}});
        nodes.push_back({{"op", n.op},
                         {"attributes", n.attributes},
                         {"kind", detail::kind_name(n.kind)},
                         {"inputs", n.inputs},
                         {"output", n.output},
                         {"in_place", n.in_place},
                         {"steps", std::move(steps)}});
    }
    const json graph = {{"version", detail::graph_format_version},
                        {"batch", g.batch},
                        {"values", std::move(values)},
                        {"nodes", std::move(nodes)},
                        {"inputs", g.inputs},
                        {"outputs", g.outputs},
                        {"memory",
                         {{"planned", g.memory.planned},
                          {"peak_bytes_before", g.memory.peak_bytes_before},
                          {"peak_bytes_after", g.memory.peak_bytes_after},
                          {"in_place_nodes", g.memory.in_place_nodes}}}};
    const std::string text = graph.dump();
    writer.set_metadata("format", "dl.graph");
    writer.set_metadata("dl.graph", text);
    writer.set_metadata(std::string(detail::graph_crc_key), nn::detail::format_crc(crc32c(text.data(), text.size())));
    writer.write(path);
}
/// save(f.graph(), path).
template <class = void>
void save(const function& f, const std::filesystem::path& path) {
    save(f.graph(), path);
}

/// What load() may allocate beyond the tensors the file holds.
struct load_options {
    /// The most bytes the zero-filled stand-ins and op results of the rebuild may hold at once. They
    /// follow the shapes the file declares, so a file of a few KB could otherwise ask for any amount.
    std::int64_t max_rebuild_bytes = std::int64_t(4) << 30;
};

/// Reads what save() wrote and rebuilds every kernel; the graph runs on ctx, its parameters (which
/// still require grad, so the loaded graph can be trained further) and constants live there. T, More...
/// are the floating types the graph may compute in (casts convert between any types): each costs the
/// compile time of every op's definition in that type, so a service lists the ones it serves. A file
/// that is not a dl graph, is malformed, names ops dl cannot rebuild or computes in a type not listed
/// fails with a dl::error naming the file, the node and what is wrong; so does one that is damaged
/// (a checksum does not match) or whose rebuild would need more than options.max_rebuild_bytes.
template <class T = float, class... More>
[[nodiscard]] function load(const std::filesystem::path& path, Context& ctx = default_context(), const load_options& options = {}) {
    static_assert(is_floating_element<T> && (is_floating_element<More> && ...),
                  "dl::graph::load: list the floating types the graph computes in");
    using nlohmann::json;
    const std::string where = path.string();
    const nn::safetensors_file file(path);
    const auto format = file.metadata().find("format");
    const auto text = file.metadata().find("dl.graph");
    if (format == file.metadata().end() || format->second != "dl.graph" || text == file.metadata().end())
        dl::detail::fail("dl::graph::load: ", where, " is not a dl graph (no \"dl.graph\" metadata; dl::graph::save writes one)");
    if (const auto crc = file.metadata().find(std::string(detail::graph_crc_key)); crc != file.metadata().end()) {
        const std::uint32_t actual = crc32c(text->second.data(), text->second.size());
        if (nn::detail::parse_crc(crc->second) != actual)
            detail::load_failure(where, "the graph is damaged (CRC32C mismatch): its \"dl.graph\" metadata sums to ",
                                 nn::detail::format_crc(actual), ", its header says \"", crc->second, "\"");
    }
    Graph g;
    try {
        const json graph = json::parse(text->second);
        if (graph.at("version").get<int>() != detail::graph_format_version)
            detail::load_failure(where, "format version ", graph.at("version").dump(), ", this dl reads version ", detail::graph_format_version);
        g.batch = graph.at("batch").get<std::int64_t>();
        auto dtype_of_name = [&](const json& j) {
            const std::string name = j.get<std::string>();
            for (DType d : {DType::boolean, DType::uint8, DType::int32, DType::int64, DType::float32, DType::float64,
                            DType::bfloat16, DType::float16})
                if (dtype_name(d) == name) return d;
            detail::load_failure(where, "unknown dtype \"", name, "\"");
        };
        for (const json& v : graph.at("values")) {
            value parsed;
            parsed.dtype = dtype_of_name(v.at("dtype"));
            const auto shape = v.at("shape").get<std::vector<std::int64_t>>();
            if (shape.size() > static_cast<std::size_t>(max_rank)) detail::load_failure(where, "a value of rank ", shape.size());
            for (auto e : shape) {
                if (e < 0) detail::load_failure(where, "a negative extent in value %", g.values.size());
                parsed.shape.push_back(e);
            }
            const auto numel = parsed.shape.checked_numel();
            if (std::int64_t bytes = 0; !numel || __builtin_mul_overflow(*numel, static_cast<std::int64_t>(dtype_size(parsed.dtype)), &bytes))
                detail::load_failure(where, "value %", g.values.size(), " has shape ", parsed.shape, ", too many elements to address");
            parsed.batched = v.at("batched").get<bool>();
            const std::string source = v.at("source").get<std::string>();
            const auto id = static_cast<int>(g.values.size());
            if (source == "input") parsed.source = value_source::input;
            else if (source == "parameter") parsed.source = value_source::parameter;
            else if (source == "constant") parsed.source = value_source::constant;
            else if (source == "node") parsed.source = value_source::node;
            else detail::load_failure(where, "value %", id, " has an unknown source \"", source, "\"");
            if (parsed.source == value_source::parameter || parsed.source == value_source::constant) {
                const std::string name = detail::tensor_name(id);
                if (!file.contains(name)) detail::load_failure(where, "no tensor ", name, " for ", source, " %", id);
                const auto& stored = file.tensors().at(name);
                if (stored.dtype != parsed.dtype || stored.shape != parsed.shape)
                    detail::load_failure(where, "tensor ", name, " is ", stored.dtype, " ", stored.shape, ", the graph says ", parsed.dtype, " ", parsed.shape);
                parsed.data = detail::with_dtype(parsed.dtype, [&]<class E>(std::type_identity<E>) -> any_tensor {
                    Tensor<E> t = file.get<E>(name, ctx);
                    if constexpr (is_floating_element<E>)
                        if (parsed.source == value_source::parameter) t.requires_grad_(true);
                    return t;
                });
            }
            g.add_value(std::move(parsed));
        }
        const auto count = static_cast<int>(g.values.size());
        auto value_id = [&](const json& j, const auto&... context) {
            const int id = j.get<int>();
            if (id < 0 || id >= count) detail::load_failure(where, context..., " refers to %", id, ", which does not exist (", count, " values)");
            return id;
        };
        for (const json& j : graph.at("inputs")) g.inputs.push_back(value_id(j, "an input"));
        for (const json& j : graph.at("outputs")) g.outputs.push_back(value_id(j, "an output"));
        for (const json& j : graph.at("nodes")) {
            node n;
            const auto index = g.nodes.size();
            n.op = j.at("op").get<std::string>();
            n.attributes = j.at("attributes").get<std::string>();
            const std::string kind = j.at("kind").get<std::string>();
            if (kind == "elementwise") n.kind = op_kind::elementwise;
            else if (kind == "view") n.kind = op_kind::view;
            else if (kind == "pure") n.kind = op_kind::pure;
            else detail::load_failure(where, "node ", index, " (", n.op, ") has kind \"", kind, "\", which dl does not load");
            for (const json& in : j.at("inputs")) n.inputs.push_back(value_id(in, "node ", index, " (", n.op, ")"));
            n.output = value_id(j.at("output"), "node ", index, " (", n.op, ")");
            if (g.values[static_cast<std::size_t>(n.output)].source != value_source::node)
                detail::load_failure(where, "node ", index, " (", n.op, ") makes %", n.output, ", which is not a node's value");
            n.in_place = j.at("in_place").get<int>();
            for (const json& s : j.at("steps")) {
                fused_step step{s.at("op").get<std::string>(), s.at("attributes").get<std::string>(),
                                s.at("inputs").get<std::vector<int>>(), dtype_of_name(s.at("dtype")), {}};
                n.steps.push_back(std::move(step));
            }
            if (const std::string why = detail::unsaveable(n); !why.empty())
                detail::load_failure(where, "node ", index, " (", n.op, ") cannot be loaded: ", why);
            g.nodes.push_back(std::move(n));
        }
        const json& memory = graph.at("memory");
        g.memory = {memory.at("planned").get<bool>(), memory.at("peak_bytes_before").get<std::int64_t>(),
                    memory.at("peak_bytes_after").get<std::int64_t>(), memory.at("in_place_nodes").get<int>()};
    } catch (const json::exception& e) {
        detail::load_failure(where, "malformed graph: ", e.what());
    }
    g.reindex();
    // SSA order and ids first, so rebuilding reads only values that exist and are made before use.
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        node& n = g.nodes[i];
        if (g.values[static_cast<std::size_t>(n.output)].producer != static_cast<int>(i))
            detail::load_failure(where, "%", n.output, " is made by more than one node");
        for (int in : n.inputs) {
            const value& v = g.values[static_cast<std::size_t>(in)];
            if (v.source == value_source::node && (v.producer < 0 || v.producer >= static_cast<int>(i)))
                detail::load_failure(where, "node ", i, " (", n.op, ") reads %", in, " before it is made");
        }
        for (std::size_t s = 0; s < n.steps.size(); ++s)
            for (int in : n.steps[s].inputs)
                if (in >= 0 ? in >= static_cast<int>(n.inputs.size()) : -1 - in >= static_cast<int>(s))
                    detail::load_failure(where, "node ", i, " (", n.op, ") step ", s, " reads an input that does not exist");
    }

    // Rebuild the kernels. Zero-filled tensors stand for every value that is not a parameter or a
    // constant: an op's kernel depends on its inputs' types and its attributes, never their values.
    // Elementwise and fused nodes take their kernels from the functors, reading no stand-in. Each
    // stand-in goes after its last reader; what they and each op's result hold at once is bounded
    // before any is made (the sizes were checked for overflow above, the sums saturate).
    auto by_call = [](const node& n) { return !n.fused() && n.kind != op_kind::elementwise; };
    auto bytes_of = [&](int id) {
        const value& v = g.values[static_cast<std::size_t>(id)];
        return v.shape.numel() * static_cast<std::int64_t>(dtype_size(v.dtype));
    };
    auto add = [](std::int64_t a, std::int64_t b) {
        return __builtin_add_overflow(a, b, &a) ? std::numeric_limits<std::int64_t>::max() : a;
    };
    std::vector<std::size_t> last_use(g.values.size(), 0);
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
        if (by_call(g.nodes[i]))
            for (int in : g.nodes[i].inputs) last_use[static_cast<std::size_t>(in)] = i;
    {
        enum : char { none, held, released };
        std::vector<char> state(g.values.size(), none);
        std::int64_t holding = 0, peak = 0;
        for (std::size_t i = 0; i < g.nodes.size(); ++i) {
            const node& n = g.nodes[i];
            if (!by_call(n)) continue;
            for (int in : n.inputs)
                if (g.values[static_cast<std::size_t>(in)].data.index() == 0 && state[static_cast<std::size_t>(in)] == none) {
                    state[static_cast<std::size_t>(in)] = held;
                    holding = add(holding, bytes_of(in));
                }
            peak = std::max(peak, add(holding, n.kind == op_kind::view ? 0 : bytes_of(n.output)));
            for (int in : n.inputs)
                if (state[static_cast<std::size_t>(in)] == held && last_use[static_cast<std::size_t>(in)] == i) {
                    state[static_cast<std::size_t>(in)] = released;
                    holding -= bytes_of(in);
                }
        }
        if (peak > options.max_rebuild_bytes)
            detail::load_failure(where, "rebuilding its kernels needs ", peak,
                                 " bytes at once (zero-filled stand-ins of the shapes it declares, and each op's result), more than the limit of ",
                                 options.max_rebuild_bytes, " bytes (graph::load_options::max_rebuild_bytes)");
    }
    std::vector<any_tensor> stand_ins(g.values.size());
    auto stand_in = [&](int id) -> const any_tensor& {
        const value& v = g.values[static_cast<std::size_t>(id)];
        any_tensor& p = stand_ins[static_cast<std::size_t>(id)];
        if (p.index() == 0)
            p = v.data.index() != 0 ? v.data : detail::with_dtype(v.dtype, [&]<class E>(std::type_identity<E>) -> any_tensor {
                return zeros<E>(v.shape, ctx);
            });
        return p;
    };
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        node& n = g.nodes[i];
        const std::string at = where + ": node " + std::to_string(i);
        const DType result = g.values[static_cast<std::size_t>(n.output)].dtype;
        auto dtypes_of = [&](const std::vector<int>& ids) {
            std::vector<DType> d;
            for (int id : ids) d.push_back(g.values[static_cast<std::size_t>(id)].dtype);
            return d;
        };
        if (n.fused()) {
            for (std::size_t s = 0; s < n.steps.size(); ++s) {
                fused_step& step = n.steps[s];
                std::vector<DType> operands;
                for (int in : step.inputs)
                    operands.push_back(in >= 0 ? g.values[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(in)])].dtype
                                               : n.steps[static_cast<std::size_t>(-1 - in)].dtype);
                const std::string step_at = at + " step " + std::to_string(s);
                step.tile = detail::elementwise_tile<T, More...>({step.op, step.attributes, std::move(operands), step.dtype, step_at});
            }
        } else if (n.kind == op_kind::elementwise) {
            n.tile = detail::elementwise_tile<T, More...>({n.op, n.attributes, dtypes_of(n.inputs), result, at});
            n.kernel = detail::tile_node_kernel(n, result);
        } else {
            std::vector<any_tensor> in;
            for (int id : n.inputs) in.push_back(stand_in(id));
            detail::op_capture capture;
            try {
                const detail::recording on(ctx, capture);
                static_cast<void>(detail::call_op<T, More...>(n, at, in));
            } catch (const dl::error& e) {
                if (std::string_view(e.what()).starts_with("dl::graph::load")) throw;
                dl::detail::fail("dl::graph::load: ", at, " (", n.op, " {", n.attributes, "}): ", e.what());
            }
            const value& out = g.values[static_cast<std::size_t>(n.output)];
            if (capture.ops.size() != 1 || capture.ops[0].name != n.op || capture.ops[0].attributes != n.attributes ||
                capture.ops[0].kind != n.kind || capture.ops[0].inputs.size() != n.inputs.size())
                dl::detail::fail("dl::graph::load: ", at, " (", n.op, " {", n.attributes, "}) does not rebuild as saved: its function recorded ",
                    capture.ops.empty() ? std::string("nothing")
                                        : capture.ops[0].name + " {" + capture.ops[0].attributes + "} with " +
                                              std::to_string(capture.ops[0].inputs.size()) + " inputs");
            if (detail::dtype_of_any(capture.ops[0].output) != out.dtype || detail::shape_of_any(capture.ops[0].output) != out.shape)
                dl::detail::fail("dl::graph::load: ", at, " (", n.op, ") makes ", dtype_name(detail::dtype_of_any(capture.ops[0].output)), " ",
                    detail::shape_of_any(capture.ops[0].output), ", the file says ", g.describe_type(n.output));
            n.kernel = std::move(capture.ops[0].kernel);
            n.with_epilogue = std::move(capture.ops[0].with_epilogue);
            for (int id : n.inputs)
                if (last_use[static_cast<std::size_t>(id)] == i) stand_ins[static_cast<std::size_t>(id)] = {};
        }
    }
    try {
        g.verify();
    } catch (const dl::error& e) {
        detail::load_failure(where, e.what());
    }
    return function(std::move(g), ctx);
}

}  // namespace dl::graph
