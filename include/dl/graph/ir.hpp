#pragma once
// The graph IR: SSA values (each made once, by one node or given as an input, a parameter or a
// constant) and nodes in a topological order. A node is a recorded op (autograd/tracing.hpp): its name,
// attributes, inputs and the kernel that runs the op's own definition; a fused node runs a chain of such
// kernels tile by tile. The graph prints one line per node, and verify() checks what every pass must
// keep true.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../autograd/tracing.hpp"
#include "../core/error.hpp"

namespace dl::graph {

using autograd::any_tensor;
using autograd::fused_step;
using autograd::op_kernel;
using autograd::op_kind;
using autograd::product_epilogue;
using autograd::tile_kernel;
using autograd::tile_operand;

enum class value_source : std::uint8_t { input, parameter, constant, node };

struct value {
    DType dtype = DType::float32;
    Shape shape;            ///< as traced
    bool batched = false;   ///< dimension 0 is the batch, which may differ from run to run
    value_source source = value_source::node;
    int producer = -1;      ///< the node that makes it (source node)
    any_tensor data;        ///< a parameter (by handle, so training updates show) or a constant

    [[nodiscard]] std::int64_t bytes() const {
        return shape.numel() * static_cast<std::int64_t>(dtype_size(dtype));
    }
};

/// A fused node's chain compiled into one loop (graph/codegen.hpp): `run` computes `count` results at
/// out from the node's inputs (inputs[k]: count contiguous elements, or the one element when
/// broadcast[k]); with `stream`, out is batch-aligned and takes streaming stores (see
/// dl::detail::streams), fenced before run returns. `library` keeps the code loaded while any copy
/// of the node holds it.
struct compiled_chain {
    void (*run)(const void* const* inputs, const unsigned char* broadcast, void* out, std::int64_t count,
                bool stream) = nullptr;
    std::shared_ptr<void> library;
    explicit operator bool() const noexcept { return run != nullptr; }
};

struct node {
    std::string op;
    std::string attributes;
    op_kind kind = op_kind::pure;
    std::vector<int> inputs;  ///< value ids
    int output = -1;          ///< value id
    op_kernel kernel;         ///< null for a fused node
    tile_kernel tile;         ///< elementwise nodes: the op over one tile of raw memory
    std::function<op_kernel(product_epilogue)> with_epilogue;  ///< products: the kernel with another epilogue
    std::vector<fused_step> steps;  ///< a fused node: elementwise kernels run tile by tile, the last makes the output
    compiled_chain compiled;  ///< a fused node whose steps were compiled into one loop; runs instead of them
    int in_place = -1;        ///< memory plan: the input position whose buffer the output may take over

    [[nodiscard]] bool fused() const noexcept { return !steps.empty(); }
};

/// What memory planning found, at the traced shapes.
struct memory_report {
    bool planned = false;
    std::int64_t peak_bytes_before = 0;  ///< every intermediate kept to the end of a run
    std::int64_t peak_bytes_after = 0;   ///< each freed after its last use, in-place ops reusing their input
    int in_place_nodes = 0;
};

struct Graph {
    std::vector<value> values;
    std::vector<node> nodes;  ///< in an order where every input is made before its use
    std::vector<int> inputs, outputs;
    std::int64_t batch = 0;   ///< the traced batch size (dimension 0 of the first input)
    memory_report memory;

    int add_value(value v) {
        values.push_back(std::move(v));
        return static_cast<int>(values.size()) - 1;
    }
    /// Re-derives each value's producer from the node order (after a pass edits the node list).
    void reindex() {
        for (auto& v : values)
            if (v.source == value_source::node) v.producer = -1;
        for (int i = 0; i < static_cast<int>(nodes.size()); ++i) values[static_cast<std::size_t>(nodes[i].output)].producer = i;
    }
    /// Points every use of value `from` (node inputs and graph outputs) at `to`.
    void replace_uses(int from, int to) {
        for (auto& n : nodes)
            for (auto& in : n.inputs)
                if (in == from) in = to;
        for (auto& out : outputs)
            if (out == from) out = to;
    }
    /// The number of node inputs and graph outputs that read each value.
    [[nodiscard]] std::vector<int> use_counts() const {
        std::vector<int> uses(values.size(), 0);
        for (const auto& n : nodes)
            for (int in : n.inputs) ++uses[static_cast<std::size_t>(in)];
        for (int out : outputs) ++uses[static_cast<std::size_t>(out)];
        return uses;
    }

    [[nodiscard]] std::string describe_type(int id) const {
        const value& v = values[static_cast<std::size_t>(id)];
        std::ostringstream os;
        os << dtype_name(v.dtype) << '[';
        for (int d = 0; d < v.shape.size(); ++d) {
            if (d) os << ", ";
            if (d == 0 && v.batched)
                os << 'N';
            else
                os << v.shape[d];
        }
        os << ']';
        return os.str();
    }

    /// One line per input, parameter, constant and node, then the outputs.
    [[nodiscard]] std::string to_string() const {
        std::ostringstream os;
        os << "graph(";
        for (std::size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << '%' << inputs[i] << ": " << describe_type(inputs[i]);
        os << ") {\n";
        for (int id = 0; id < static_cast<int>(values.size()); ++id) {
            const value& v = values[static_cast<std::size_t>(id)];
            if (v.source == value_source::parameter || v.source == value_source::constant)
                os << "  %" << id << " = " << (v.source == value_source::parameter ? "parameter" : "constant") << " : "
                   << describe_type(id) << '\n';
        }
        auto arguments = [](std::ostringstream& out, const std::vector<int>& ids, auto&& name_of) {
            for (std::size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << name_of(ids[i]);
        };
        for (const node& n : nodes) {
            os << "  %" << n.output << " = " << n.op << '(';
            arguments(os, n.inputs, [](int id) { return '%' + std::to_string(id); });
            os << ')';
            if (!n.attributes.empty()) os << " {" << n.attributes << '}';
            os << " : " << describe_type(n.output);
            if (n.in_place >= 0) os << "  # in place of %" << n.inputs[static_cast<std::size_t>(n.in_place)];
            if (n.compiled) os << "  # compiled";
            os << '\n';
            for (std::size_t s = 0; s < n.steps.size(); ++s) {
                const fused_step& step = n.steps[s];
                os << "      #" << s << " = " << step.op << '(';
                arguments(os, step.inputs, [&](int i) {
                    return i >= 0 ? '%' + std::to_string(n.inputs[static_cast<std::size_t>(i)]) : '#' + std::to_string(-1 - i);
                });
                os << ')';
                if (!step.attributes.empty()) os << " {" << step.attributes << '}';
                os << " : " << dtype_name(step.dtype) << '\n';
            }
        }
        os << "  return ";
        arguments(os, outputs, [](int id) { return '%' + std::to_string(id); });
        os << "\n}\n";
        return os.str();
    }

    /// Checks SSA form (each value made once, before its uses, by the node it names), that no use
    /// dangles, that every node has a kernel (or fused steps) and that types agree: elementwise outputs
    /// have the broadcast shape of their inputs, views and fused steps keep element counts and dtypes
    /// consistent. Throws dl::error naming the node and the rule.
    void verify() const {
        const int count = static_cast<int>(values.size());
        std::vector<char> defined(values.size(), 0);
        auto check = [](bool ok, const auto&... what) {
            if (!ok) dl::detail::fail("dl::graph::verify: ", what...);
        };
        for (int id = 0; id < count; ++id) {
            const value& v = values[static_cast<std::size_t>(id)];
            if (v.source == value_source::parameter || v.source == value_source::constant) {
                check(v.data.index() != 0, "%", id, " is a ", v.source == value_source::parameter ? "parameter" : "constant",
                      " without a tensor");
                defined[static_cast<std::size_t>(id)] = 1;
            }
        }
        for (int id : inputs) {
            check(id >= 0 && id < count && values[static_cast<std::size_t>(id)].source == value_source::input,
                  "graph input %", id, " is not an input value");
            defined[static_cast<std::size_t>(id)] = 1;
        }
        for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
            const node& n = nodes[static_cast<std::size_t>(i)];
            check(n.fused() || static_cast<bool>(n.kernel), "node ", i, " (", n.op, ") has no kernel");
            for (const fused_step& step : n.steps)
                check(static_cast<bool>(step.tile), "node ", i, " (", n.op, ") has a step (", step.op, ") without a tile kernel");
            check(n.output >= 0 && n.output < count, "node ", i, " (", n.op, ") makes value %", n.output, ", which does not exist");
            const value& out = values[static_cast<std::size_t>(n.output)];
            check(out.source == value_source::node && out.producer == i, "%", n.output, " is not made by node ", i, " (",
                  n.op, ") alone");
            check(!defined[static_cast<std::size_t>(n.output)], "%", n.output, " is defined twice (node ", i, ", ", n.op, ")");
            Shape broadcast;
            for (int in : n.inputs) {
                check(in >= 0 && in < count, "node ", i, " (", n.op, ") reads %", in, ", which does not exist");
                check(defined[static_cast<std::size_t>(in)], "node ", i, " (", n.op, ") reads %", in,
                      " before it is defined");
                if (n.kind == op_kind::elementwise)
                    broadcast = broadcast_shapes(broadcast, values[static_cast<std::size_t>(in)].shape, n.op);
            }
            if (n.kind == op_kind::elementwise && !n.inputs.empty())
                check(broadcast == out.shape, "node ", i, " (", n.op, ") is elementwise but makes shape ", out.shape,
                      " from inputs that broadcast to ", broadcast);
            if (n.kind == op_kind::view && (n.op == "reshape" || n.op == "clone"))
                check(values[static_cast<std::size_t>(n.inputs.at(0))].shape.numel() == out.shape.numel(), "node ", i, " (",
                      n.op, ") changes the element count");
            if (n.in_place >= 0) {
                check(n.in_place < static_cast<int>(n.inputs.size()), "node ", i, " (", n.op, ") reuses input ", n.in_place,
                      " of ", n.inputs.size());
                const value& reused = values[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(n.in_place)])];
                check(reused.dtype == out.dtype && reused.shape == out.shape, "node ", i, " (", n.op,
                      ") reuses an input of another type");
            }
            for (std::size_t s = 0; s < n.steps.size(); ++s)
                for (int in : n.steps[s].inputs)
                    check(in >= 0 ? in < static_cast<int>(n.inputs.size()) : -1 - in < static_cast<int>(s), "node ", i,
                          " (", n.op, ") step ", s, " reads an input that does not exist");
            if (n.fused()) check(n.steps.back().dtype == out.dtype, "node ", i, " (", n.op, ") ends in the wrong dtype");
            defined[static_cast<std::size_t>(n.output)] = 1;
        }
        for (int id : outputs)
            check(id >= 0 && id < count && defined[static_cast<std::size_t>(id)], "graph output %", id, " is not defined");
    }
};

namespace detail {

/// The text of attribute `key` in "key=value, key=value" attributes (a node's or a fused step's);
/// empty when absent. A list value ("[a, b]") is read by parse_dims.
[[nodiscard]] inline std::string_view attribute(std::string_view attributes, std::string_view key) {
    std::string_view rest = attributes;
    while (!rest.empty()) {
        const std::size_t end = std::min(rest.find(", "), rest.size());
        const std::string_view pair = rest.substr(0, end);
        if (pair.size() > key.size() && pair.starts_with(key) && pair[key.size()] == '=') return pair.substr(key.size() + 1);
        rest.remove_prefix(std::min(end + 2, rest.size()));
    }
    return {};
}
[[nodiscard]] inline std::string_view attribute(const node& n, std::string_view key) { return attribute(n.attributes, key); }

[[noreturn]] inline void unreadable_attribute(std::string_view op, std::string_view attributes, std::string_view key) {
    dl::detail::fail("dl::graph: node ", op, " has no readable attribute ", key, " in {", attributes, "}");
}

template <class V>
[[nodiscard]] V parse_attribute(std::string_view op, std::string_view attributes, std::string_view key) {
    const std::string_view text = attribute(attributes, key);
    V v{};
    if constexpr (std::is_same_v<V, bool>) {
        if (text != "true" && text != "false") unreadable_attribute(op, attributes, key);
        v = text == "true";
    } else {
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || error != std::errc{} || end != text.data() + text.size()) unreadable_attribute(op, attributes, key);
    }
    return v;
}
template <class V>
[[nodiscard]] V parse_attribute(const node& n, std::string_view key) {
    return parse_attribute<V>(n.op, n.attributes, key);
}

/// A list attribute "key=[a, b, ...]" (as Dims print). The generic attribute() reader stops at the
/// first ", ", which a list contains.
[[nodiscard]] inline Dims parse_dims(const node& n, std::string_view key) {
    const std::string_view text = n.attributes;
    const std::string opening = std::string(key) + "=[";
    std::size_t at = text.find(opening);
    while (at != std::string_view::npos && at != 0 && text[at - 1] != ' ') at = text.find(opening, at + 1);
    const std::size_t close = at == std::string_view::npos ? at : text.find(']', at);
    if (close == std::string_view::npos) unreadable_attribute(n.op, n.attributes, key);
    Dims dims;
    for (std::size_t p = at + opening.size(); p < close;) {
        std::int64_t v = 0;
        const auto [end, error] = std::from_chars(text.data() + p, text.data() + close, v);
        if (error != std::errc{} || dims.size() == max_rank) unreadable_attribute(n.op, n.attributes, key);
        dims.push_back(v);
        p = static_cast<std::size_t>(end - text.data());
        if (p < close) p += 2;  // ", "
    }
    return dims;
}

}  // namespace detail

}  // namespace dl::graph
