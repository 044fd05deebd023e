#pragma once
// What an op tells a graph tracer (graph/trace.hpp). While a Context has a recorder attached, every op
// with a kernel of its own describes what it just did: its name, its attributes, the tensors it read,
// the tensor it made, and a kernel that runs the same op again on other tensors. That kernel calls the
// op's own public function with recording paused, so a graph node is the op definition and not a second
// implementation (DESIGN.md, principle 1). Ops composed of other ops need nothing: their parts record
// themselves.
#include <charconv>
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "../core/tensor.hpp"
#include "../expr/activation.hpp"
#include "../expr/expression.hpp"

namespace dl::autograd {

/// A tensor of any element type (monostate: none).
using any_tensor = std::variant<std::monostate, Tensor<float>, Tensor<double>, Tensor<bfloat16>, Tensor<float16>,
                                Tensor<std::int32_t>, Tensor<std::int64_t>, Tensor<std::uint8_t>, Tensor<bool>>;

enum class op_kind : std::uint8_t {
    elementwise,  ///< one functor over broadcast operands; its kernel can write into a given buffer
    view,         ///< shares its input's storage
    pure,         ///< any other op whose result depends on its inputs and attributes alone
    effectful,    ///< draws random numbers or updates state (dropout, batch_norm in training): never
                  ///< folded, merged or removed
};

/// Runs the op on `inputs` (tensors in the order the record listed them). When `out` holds a tensor of
/// the result's shape and dtype, an elementwise kernel writes into it; every other kernel sets `out`.
using op_kernel = std::function<void(std::span<const any_tensor> inputs, any_tensor& out)>;

/// An operand of an elementwise op over one tile of raw memory: `count` contiguous elements of the
/// operand's dtype at data, or (broadcast) the one element at data.
struct tile_operand {
    const void* data;
    bool broadcast;
};
/// An elementwise op over one tile: inputs in the record's input order, `count` results at out. The
/// op's functor in the device's row loop, with no tensor bookkeeping, so a fused node can run small
/// tiles that stay in L1. `cost` is the functor's work per element, which decides, as in an eager
/// loop, whether a node is worth spreading over threads.
struct tile_kernel {
    std::function<void(const tile_operand* inputs, void* out, std::int64_t count)> run;
    int cost = 1;
    explicit operator bool() const noexcept { return static_cast<bool>(run); }
};

/// One step of a chain of elementwise ops: its op and attributes (as recorded), its operands (index
/// >= 0: the chain's input; -1 - s: the result of step s), its result's dtype and its tile kernel.
struct fused_step {
    std::string op;
    std::string attributes;
    std::vector<int> inputs;
    DType dtype;
    tile_kernel tile;
};

/// What a product's epilogue applies to its result: the activation, then (conv2d only) a max pool of
/// max_pool × max_pool windows at stride max_pool, 0 for none. See record_product.
struct product_epilogue {
    activation act = activation::none;
    std::int64_t max_pool = 0;
};

struct op_record {
    std::string name;
    std::string attributes;  ///< as text: everything besides the inputs that the result depends on
    op_kind kind = op_kind::pure;
    std::vector<any_tensor> inputs;
    any_tensor output;
    op_kernel kernel;
    tile_kernel tile;  ///< elementwise ops only
    /// Ops with a GEMM epilogue (linear, conv2d): the kernel of the same op with another epilogue, so
    /// that passes can fold a following activation (or, into conv2d, max pool) into the product.
    std::function<op_kernel(product_epilogue)> with_epilogue;
};

/// Receives the ops of a Context while attached to it (Context::set_recorder).
class recorder {
public:
    virtual ~recorder() = default;
    virtual void record(op_record&& op) = 0;
    /// Called before an op writes into existing elements at `data`: throws if they belong to a value
    /// being traced (a graph is SSA: a traced value never changes once made).
    virtual void check_write(const void* data, std::string_view op) const = 0;
};

/// Detaches ctx's recorder for its lifetime: an op runs its parts unrecorded, since it records itself.
class recording_paused {
public:
    explicit recording_paused(Context& ctx) noexcept : ctx_(ctx), previous_(ctx.recorder()) { ctx.set_recorder(nullptr); }
    recording_paused(const recording_paused&) = delete;
    recording_paused& operator=(const recording_paused&) = delete;
    ~recording_paused() { ctx_.set_recorder(previous_); }

private:
    Context& ctx_;
    recorder* previous_;
};

namespace detail {

inline void describe_value(std::ostream& os, double v) {
    char buffer[32];
    const auto end = std::to_chars(buffer, buffer + sizeof buffer, v).ptr;  // shortest exact form
    os.write(buffer, end - buffer);
}
inline void describe_value(std::ostream& os, float v) {
    char buffer[32];
    const auto end = std::to_chars(buffer, buffer + sizeof buffer, v).ptr;
    os.write(buffer, end - buffer);
}
template <class V>
void describe_value(std::ostream& os, const V& v) {
    if constexpr (std::is_same_v<V, bool>)
        os << (v ? "true" : "false");
    else if constexpr (std::is_enum_v<V>)
        os << static_cast<int>(v);
    else if constexpr (is_half_float<V>)
        describe_value(os, static_cast<float>(v));
    else
        os << v;
}

inline void describe_pairs(std::ostream&) {}
template <class V, class... Rest>
void describe_pairs(std::ostream& os, std::string_view key, const V& value, const Rest&... rest) {
    os << key << '=';
    describe_value(os, value);
    if constexpr (sizeof...(Rest) > 0) os << ", ";
    describe_pairs(os, rest...);
}

/// Where a saved argument of a recorded op comes from when its kernel runs: a tensor is the input with
/// this index (-1: a null tensor, such as an absent bias); anything else is kept by value.
template <class A>
struct argument_slot {
    A value;
    [[nodiscard]] const A& get(std::span<const any_tensor>) const { return value; }
};
template <class T>
struct argument_slot<Tensor<T>> {
    int input = -1;
    [[nodiscard]] Tensor<T> get(std::span<const any_tensor> inputs) const {
        return input < 0 ? Tensor<T>() : std::get<Tensor<T>>(inputs[static_cast<std::size_t>(input)]);
    }
};

}  // namespace detail

/// "key=value, key=value" for an op's attributes (floating values in their shortest exact form).
template <class... KV>
[[nodiscard]] std::string attributes(const KV&... kv) {
    std::ostringstream os;
    detail::describe_pairs(os, kv...);
    return os.str();
}

/// The recorder of the first defined tensor among args, or null when nothing is traced.
template <class... Args>
[[nodiscard]] recorder* recorder_of(const Args&... args) noexcept {
    recorder* r = nullptr;
    auto one = [&]<class A>(const A& a) {
        if constexpr (is_tensor_v<A>)
            if (!r && a.defined()) r = a.context().recorder();
    };
    (one(args), ...);
    return r;
}

namespace detail {

/// A kernel calling fn with the saved arguments `slots` (tensors taken from the kernel's inputs).
template <class F, class Slots>
[[nodiscard]] op_kernel kernel_of(F fn, Slots slots) {
    return [fn = std::move(fn), slots = std::move(slots)](std::span<const any_tensor> inputs, any_tensor& out) {
        out = std::apply([&](const auto&... s) { return fn(s.get(inputs)...); }, slots);
    };
}

struct no_epilogue {};

template <class Epilogue, class F, class... Args>
auto record_with(recorder& r, op_record op, const Epilogue& epilogue, F fn, const Args&... args)
    -> std::invoke_result_t<F&, const Args&...> {
    Context* ctx = nullptr;
    auto find_context = [&]<class A>(const A& a) {
        if constexpr (is_tensor_v<A>)
            if (!ctx && a.defined()) ctx = &a.context();
    };
    (find_context(args), ...);
    auto result = [&] {
        const recording_paused pause(*ctx);
        return fn(args...);
    }();
    op.output = result;
    auto slot = [&]<class A>(const A& a) {
        if constexpr (is_tensor_v<A>) {
            argument_slot<A> s;
            if (a.defined()) {
                s.input = static_cast<int>(op.inputs.size());
                op.inputs.emplace_back(a);
            }
            return s;
        } else {
            return argument_slot<A>{a};
        }
    };
    // Braced initialisation runs the slots in order, so inputs are numbered left to right.
    std::tuple<argument_slot<Args>...> slots{slot(args)...};
    if constexpr (!std::is_same_v<Epilogue, no_epilogue>)
        op.with_epilogue = [epilogue, slots](product_epilogue e) { return kernel_of(epilogue(e), slots); };
    op.kernel = kernel_of(std::move(fn), std::move(slots));
    r.record(std::move(op));
    return result;
}

}  // namespace detail

/// Runs fn(args...) with recording paused and records it as one op named `name`. Tensor arguments
/// become the op's inputs (null ones stay null); every other argument is saved by value for the kernel,
/// which calls fn again. `attributes` must describe those saved arguments completely: passes merge ops
/// with equal names, attributes and inputs.
template <class F, class... Args>
auto record_op(recorder& r, std::string name, std::string attributes, op_kind kind, F fn, const Args&... args)
    -> std::invoke_result_t<F&, const Args&...> {
    op_record op;
    op.name = std::move(name);
    op.attributes = std::move(attributes);
    op.kind = kind;
    return detail::record_with(r, std::move(op), detail::no_epilogue{}, std::move(fn), args...);
}

/// record_op for a product with a GEMM epilogue: fn_for(e) is the op applying product_epilogue e (its
/// attributes say "act=<a>", then "max_pool=<k>" when k > 0); the product recorded is fn_for(epilogue).
template <class FnFor, class... Args>
auto record_product(recorder& r, std::string name, std::string attributes, product_epilogue epilogue, FnFor fn_for,
                    const Args&... args) {
    op_record op;
    op.name = std::move(name);
    op.attributes = std::move(attributes);
    return detail::record_with(r, std::move(op), fn_for, fn_for(epilogue), args...);
}

}  // namespace dl::autograd
