#pragma once
// Tensor<T>: a handle to strided elements — storage + shape + strides (in elements) + offset.
//
// Like torch::Tensor and std::shared_ptr, copying a Tensor copies the handle: both refer to the same
// elements. Views (slice, transpose, expand, ...) are Tensors sharing storage, never copies.
// Writing elements goes through assignment from an expression (expr/):
//   t = a + b;          writes into t's elements (t's shape must be the broadcast shape of a + b);
//                       a null Tensor (default-constructed) is allocated instead.
//   t.slice(0, 1, 3) = 0.0f;   writes into part of t.
//   Tensor<float> u = a + b;   allocates u and evaluates into it.
//   With autograd, when an operand requires grad, `t = expr` records the op and gives t new storage
//   instead (values saved for backward are never overwritten); see autograd/elementwise.hpp.
//   t = other_tensor;  rebinds the handle (lvalue), but copies elements into a temporary view:
//                       t.slice(...) = other is an element copy, as in PyTorch.
// Use clone() for an independent copy.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <type_traits>
#include <utility>

#include "context.hpp"
#include "dtype.hpp"
#include "half.hpp"
#include "error.hpp"
#include "shape.hpp"
#include "storage.hpp"

namespace dl {

namespace detail {
/// Base of every expression node (expr/); lets core accept expressions without including them.
struct expression_tag {};

/// Autograd state a tensor may carry (autograd/ derives from this). Core only counts references, so
/// a tensor that needs no gradient pays for one null pointer.
struct grad_link {
    std::atomic<int> refs{1};
    void (*destroy)(grad_link*) noexcept = nullptr;
};

class grad_ref {
public:
    grad_ref() noexcept = default;
    /// Adopts a link whose count already includes this reference.
    explicit grad_ref(grad_link* link) noexcept : link_(link) {}
    grad_ref(const grad_ref& other) noexcept : link_(other.link_) {
        if (link_) link_->refs.fetch_add(1, std::memory_order_relaxed);
    }
    grad_ref(grad_ref&& other) noexcept : link_(std::exchange(other.link_, nullptr)) {}
    grad_ref& operator=(grad_ref other) noexcept {
        std::swap(link_, other.link_);
        return *this;
    }
    ~grad_ref() {
        if (link_ && link_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) link_->destroy(link_);
    }
    [[nodiscard]] grad_link* get() const noexcept { return link_; }

private:
    grad_link* link_ = nullptr;
};
}  // namespace detail

/// What a view did to its source, so autograd can send the view's gradient back (see autograd/).
struct view_op {
    enum kind_t : std::uint8_t { slice, select, transpose, permute, reshape, expand, copy } kind;
    Dims args{};  ///< slice: dim, start, stop, step; select: dim, index; transpose: dims; permute: order
};

template <element T>
class Tensor;

// Defined in autograd/: Tensor's gradient members forward to them.
namespace autograd {
template <class T>
void set_requires_grad(Tensor<T>& t, bool on);
template <class T>
[[nodiscard]] Tensor<T> grad_of(const Tensor<T>& t);
template <class T>
void backward(const Tensor<T>& root, const Tensor<T>* grad, bool retain_graph);
template <class T>
void retain_grad(const Tensor<T>& t);
template <class T>
[[nodiscard]] bool is_leaf(const Tensor<T>& t);
template <class T>
[[nodiscard]] Tensor<T> record_view(const Tensor<T>& source, Tensor<T> view, const view_op& op);
}  // namespace autograd

template <class E>
concept expression_node = std::derived_from<std::remove_cvref_t<E>, detail::expression_tag>;

namespace autograd {
/// Writes e into out, recording it for autograd when an operand requires grad (autograd/).
template <class T, class E>
void assign_expression(Tensor<T>& out, E&& e, bool into_view);
}  // namespace autograd

template <element T>
class Tensor {
public:
    using value_type = T;

    /// A null tensor: no storage, rank 0, numel 1, not usable until assigned.
    Tensor() noexcept = default;

    /// Uninitialised elements of `shape`, from ctx's allocator.
    explicit Tensor(const Shape& shape, Context& ctx = default_context())
        : shape_(shape), strides_(contiguous_strides(shape)), ctx_(&ctx) {
        for (auto e : shape)
            if (e < 0) detail::fail("dl::Tensor: negative extent in shape ", shape);
        storage_ = Storage::allocate(ctx.shared_allocator(), static_cast<std::size_t>(shape.numel()) * sizeof(T));
        base_ = static_cast<T*>(storage_.data());
    }

    /// A non-owning view of user memory (e.g. a game engine's buffer), which must outlive every use.
    static Tensor borrow(T* data, const Shape& shape, const Strides& strides, Context& ctx = default_context()) {
        if (shape.size() != strides.size())
            detail::fail("dl::from_blob: shape ", shape, " and strides ", strides, " differ in rank");
        for (auto e : shape)
            if (e < 0) detail::fail("dl::from_blob: negative extent in shape ", shape);
        Tensor t;
        t.base_ = data;
        t.shape_ = shape;
        t.strides_ = strides;
        t.ctx_ = &ctx;
        return t;
    }

    /// Evaluates an expression into a new tensor (one loop, one allocation).
    template <expression_node E>
    Tensor(E&& e)  // NOLINT: implicit, so `Tensor<float> y = a + b;` reads naturally
    {
        autograd::assign_expression(*this, std::forward<E>(e), false);
    }

    Tensor(const Tensor&) noexcept = default;
    Tensor(Tensor&&) noexcept = default;
    Tensor& operator=(const Tensor&) & noexcept = default;
    Tensor& operator=(Tensor&&) & noexcept = default;
    /// On a temporary (a view): copies elements, so `t.slice(0, 0, 2) = u;` writes into t.
    Tensor& operator=(const Tensor& src) && {
        autograd::assign_expression(*this, src, true);
        return *this;
    }

    /// When an operand requires grad (and gradients are on), `t = expr` records the op and gives t new
    /// storage, so values saved for backward are never overwritten; otherwise it writes in place.
    template <class E>
        requires(expression_node<E> || std::is_arithmetic_v<std::remove_cvref_t<E>> || is_half_float<std::remove_cvref_t<E>>)
    Tensor& operator=(E&& e) & {
        autograd::assign_expression(*this, std::forward<E>(e), false);
        return *this;
    }
    template <class E>
        requires(expression_node<E> || std::is_arithmetic_v<std::remove_cvref_t<E>> || is_half_float<std::remove_cvref_t<E>>)
    Tensor& operator=(E&& e) && {
        autograd::assign_expression(*this, std::forward<E>(e), true);
        return *this;
    }

    // --- inspection ---
    [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
    [[nodiscard]] std::int64_t shape(std::int64_t dim) const { return shape_[wrap_dim(dim, rank(), "shape")]; }
    [[nodiscard]] const Strides& strides() const noexcept { return strides_; }
    [[nodiscard]] std::int64_t offset() const noexcept { return offset_; }
    [[nodiscard]] int rank() const noexcept { return shape_.size(); }
    [[nodiscard]] std::int64_t numel() const noexcept { return shape_.numel(); }
    [[nodiscard]] static constexpr DType dtype() noexcept { return dtype_of<T>; }
    [[nodiscard]] bool defined() const noexcept { return base_ != nullptr || storage_; }
    [[nodiscard]] bool owns_memory() const noexcept { return static_cast<bool>(storage_); }
    /// The Context the tensor was created with (the default one for a null tensor). It must outlive
    /// the tensor, as an arena outlives what it hands out: tensors compute with its executor.
    [[nodiscard]] Context& context() const { return ctx_ ? *ctx_ : default_context(); }
    [[nodiscard]] const Storage& storage() const noexcept { return storage_; }
    /// Address of element (0, ..., 0).
    [[nodiscard]] T* data() const noexcept { return base_ + offset_; }

    [[nodiscard]] bool is_contiguous() const noexcept {
        std::int64_t expected = 1;
        for (int i = rank() - 1; i >= 0; --i) {
            if (shape_[i] == 1) continue;
            if (shape_[i] == 0) return true;
            if (strides_[i] != expected) return false;
            expected *= shape_[i];
        }
        return true;
    }

    /// Unchecked element access (checked by at()).
    template <std::integral... I>
    [[nodiscard]] T& operator()(I... index) const noexcept {
        std::int64_t pos = 0, d = 0;
        ((pos += static_cast<std::int64_t>(index) * strides_[static_cast<int>(d++)]), ...);
        return data()[pos];
    }
    template <std::integral... I>
    [[nodiscard]] T& at(I... index) const {
        const std::int64_t idx[] = {0, static_cast<std::int64_t>(index)...};
        if (static_cast<int>(sizeof...(I)) != rank())
            detail::fail("dl::Tensor::at: ", sizeof...(I), " indices for a tensor of shape ", shape_);
        for (int d = 0; d < rank(); ++d)
            if (idx[d + 1] < 0 || idx[d + 1] >= shape_[d])
                detail::fail("dl::Tensor::at: index ", idx[d + 1], " out of range for dimension ", d, " of shape ",
                             shape_);
        return (*this)(index...);
    }
    /// The value of a one-element tensor.
    [[nodiscard]] T item() const {
        if (numel() != 1) detail::fail("dl::Tensor::item: tensor of shape ", shape_, " has ", numel(), " elements");
        return *data();
    }

    // --- views (share storage) ---
    /// Elements start, start+step, ... < stop along `dim`; negative start/stop count from the end and
    /// are clamped to the extent, as in Python.
    [[nodiscard]] Tensor slice(std::int64_t dim, std::int64_t start, std::int64_t stop, std::int64_t step = 1) const {
        const int d = wrap_dim(dim, rank(), "slice");
        if (step <= 0) detail::fail("dl::slice: step must be positive, got ", step);
        const std::int64_t n = shape_[d];
        auto clamp = [n](std::int64_t i) { return std::clamp<std::int64_t>(i < 0 ? i + n : i, 0, n); };
        start = clamp(start);
        stop = std::max(clamp(stop), start);
        Tensor v = *this;
        v.offset_ += start * strides_[d];
        v.shape_[d] = (stop - start + step - 1) / step;
        v.strides_[d] *= step;
        return finish_view(std::move(v), {view_op::slice, {d, start, stop, step}});
    }
    /// The sub-tensor at `index` of `dim`; the rank drops by one.
    [[nodiscard]] Tensor select(std::int64_t dim, std::int64_t index) const {
        const int d = wrap_dim(dim, rank(), "select");
        if (index < -shape_[d] || index >= shape_[d])
            detail::fail("dl::select: index ", index, " out of range for dimension ", d, " of shape ", shape_);
        if (index < 0) index += shape_[d];
        Tensor v = *this;
        v.offset_ += index * strides_[d];
        v.shape_.erase(d);
        v.strides_.erase(d);
        return finish_view(std::move(v), {view_op::select, {d, index}});
    }
    [[nodiscard]] Tensor transpose(std::int64_t dim0, std::int64_t dim1) const {
        const int a = wrap_dim(dim0, rank(), "transpose"), b = wrap_dim(dim1, rank(), "transpose");
        Tensor v = *this;
        std::swap(v.shape_[a], v.shape_[b]);
        std::swap(v.strides_[a], v.strides_[b]);
        return finish_view(std::move(v), {view_op::transpose, {a, b}});
    }
    /// Matrix transpose of a rank-2 tensor.
    [[nodiscard]] Tensor t() const {
        if (rank() != 2) detail::fail("dl::Tensor::t: expects rank 2, got shape ", shape_);
        return transpose(0, 1);
    }
    /// Dimension i of the result is dimension order[i] of this tensor.
    [[nodiscard]] Tensor permute(const Dims& order) const {
        if (order.size() != rank())
            detail::fail("dl::permute: order ", order, " does not match rank of shape ", shape_);
        Tensor v = *this;
        bool seen[max_rank] = {};
        for (int i = 0; i < rank(); ++i) {
            const int d = wrap_dim(order[i], rank(), "permute");
            if (seen[d]) detail::fail("dl::permute: dimension ", d, " repeated in ", order);
            seen[d] = true;
            v.shape_[i] = shape_[d];
            v.strides_[i] = strides_[d];
        }
        return finish_view(std::move(v), {view_op::permute, order});
    }
    /// Broadcasts to `shape` (numpy rules) with stride 0 along new or size-1 dimensions; -1 keeps an
    /// existing extent, as in PyTorch.
    [[nodiscard]] Tensor expand(Shape shape) const {
        if (shape.size() < rank()) detail::fail("dl::expand: cannot expand shape ", shape_, " to lower rank ", shape);
        for (int i = 0; i < shape.size(); ++i) {
            const int own = i - (shape.size() - rank());
            if (shape[i] == -1 && own >= 0) shape[i] = shape_[own];
            if (shape[i] < 0) detail::fail("dl::expand: negative extent in target shape ", shape, " for ", shape_);
        }
        Tensor v = *this;
        v.shape_ = shape;
        v.strides_ = Dims::filled(shape.size(), 0);
        const int lead = shape.size() - rank();
        for (int i = 0; i < rank(); ++i) {
            if (shape_[i] == shape[lead + i])
                v.strides_[lead + i] = strides_[i];
            else if (shape_[i] != 1)
                detail::fail("dl::expand: shape ", shape_, " cannot broadcast to ", shape);
        }
        return finish_view(std::move(v), {view_op::expand, {}});
    }
    [[nodiscard]] Tensor broadcast_to(const Shape& shape) const { return expand(shape); }
    [[nodiscard]] Tensor unsqueeze(std::int64_t dim) const {
        const int d = wrap_dim(dim, rank() + 1, "unsqueeze");
        Tensor v = *this;
        v.shape_.insert(d, 1);
        v.strides_.insert(d, d < rank() ? strides_[d] * shape_[d] : 1);
        return finish_view(std::move(v), {view_op::reshape, {}});
    }
    /// Drops every size-1 dimension.
    [[nodiscard]] Tensor squeeze() const {
        Tensor v = *this;
        for (int i = v.rank() - 1; i >= 0; --i)
            if (v.shape_[i] == 1) {
                v.shape_.erase(i);
                v.strides_.erase(i);
            }
        return finish_view(std::move(v), {view_op::reshape, {}});
    }
    /// Drops `dim` if its extent is 1 (else returns the same view, as PyTorch does).
    [[nodiscard]] Tensor squeeze(std::int64_t dim) const {
        const int d = wrap_dim(dim, rank(), "squeeze");
        Tensor v = *this;
        if (shape_[d] == 1) {
            v.shape_.erase(d);
            v.strides_.erase(d);
        }
        return finish_view(std::move(v), {view_op::reshape, {}});
    }

    /// Same elements in `shape` (one extent may be -1). A view when the strides allow it (always for
    /// contiguous tensors), otherwise a contiguous copy — check shares_storage() if it matters.
    [[nodiscard]] Tensor reshape(Shape shape) const {
        shape = infer_shape(shape);
        if (auto strides = view_strides(shape)) {
            Tensor v = *this;
            v.shape_ = shape;
            v.strides_ = *strides;
            return finish_view(std::move(v), {view_op::reshape, {}});
        }
        return contiguous().reshape(shape);
    }
    /// Merges dimensions start..end (inclusive) into one.
    [[nodiscard]] Tensor flatten(std::int64_t start = 0, std::int64_t end = -1) const {
        if (rank() == 0) return reshape({1});
        const int s = wrap_dim(start, rank(), "flatten"), e = wrap_dim(end, rank(), "flatten");
        if (s > e) detail::fail("dl::flatten: start ", start, " is after end ", end);
        Shape out;
        for (int i = 0; i < s; ++i) out.push_back(shape_[i]);
        std::int64_t merged = 1;
        for (int i = s; i <= e; ++i) merged *= shape_[i];
        out.push_back(merged);
        for (int i = e + 1; i < rank(); ++i) out.push_back(shape_[i]);
        return reshape(out);
    }

    // --- copies ---
    /// This tensor if contiguous, else a contiguous copy.
    [[nodiscard]] Tensor contiguous() const { return is_contiguous() ? *this : clone(); }
    /// A contiguous copy with its own storage.
    [[nodiscard]] Tensor clone() const {
        if (!defined()) return {};
        Tensor out(shape_, context());
        out.copy_from(*this);
        return finish_view(std::move(out), {view_op::copy, {}});
    }
    /// Copies (broadcasting and converting) the elements of `src` into this tensor.
    template <class Src>
    Tensor& copy_from(const Src& src) {
        assign(*this, src);
        return *this;
    }
    Tensor& fill(T value) {
        assign(*this, value);
        return *this;
    }

    [[nodiscard]] bool shares_storage(const Tensor& other) const noexcept {
        return defined() && base_ == other.base_;
    }

    // --- autograd (autograd/ implements these) ---
    /// Whether operations on this tensor are recorded for backward.
    [[nodiscard]] bool requires_grad() const noexcept { return grad_.get() != nullptr; }
    /// Makes this tensor a leaf that accumulates a gradient (floating element types only).
    Tensor& requires_grad_(bool on = true) {
        autograd::set_requires_grad(*this, on);
        return *this;
    }
    /// The accumulated gradient: of a leaf, or of a tensor that called retain_grad(); null otherwise.
    [[nodiscard]] Tensor grad() const { return autograd::grad_of(*this); }
    /// Back-propagates from this one-element tensor (seed 1), accumulating into the leaves' grad().
    void backward(bool retain_graph = false) const { autograd::backward(*this, static_cast<const Tensor*>(nullptr), retain_graph); }
    /// Back-propagates with `grad` (this tensor's shape) as this tensor's gradient.
    void backward(const Tensor& grad, bool retain_graph = false) const {
        autograd::backward(*this, &grad, retain_graph);
    }
    /// Keeps the gradient of a non-leaf tensor after backward.
    void retain_grad() const { autograd::retain_grad(*this); }
    /// Created by the user (or detached) rather than by a recorded op.
    [[nodiscard]] bool is_leaf() const { return autograd::is_leaf(*this); }
    /// The same elements, cut from the recorded history.
    [[nodiscard]] Tensor detach() const {
        Tensor v = *this;
        v.grad_ = {};
        return v;
    }
    /// For autograd/: the tensor's autograd state.
    [[nodiscard]] detail::grad_link* grad_link() const noexcept { return grad_.get(); }
    void set_grad_link(detail::grad_ref link) noexcept { grad_ = std::move(link); }

private:
    Tensor finish_view(Tensor v, const view_op& op) const {
        if (!grad_.get() && !(ctx_ && ctx_->recorder())) return v;
        v.grad_ = {};
        return autograd::record_view(*this, std::move(v), op);
    }

    [[nodiscard]] Shape infer_shape(Shape shape) const {
        int infer = -1;
        std::int64_t known = 1;
        for (int i = 0; i < shape.size(); ++i) {
            if (shape[i] == -1) {
                if (infer >= 0) detail::fail("dl::reshape: more than one -1 in ", shape);
                infer = i;
            } else if (shape[i] < 0) {
                detail::fail("dl::reshape: negative extent in ", shape);
            } else {
                known *= shape[i];
            }
        }
        if (infer >= 0) {
            if (known == 0 || numel() % known != 0)
                detail::fail("dl::reshape: cannot reshape ", shape_, " into ", shape);
            shape[infer] = numel() / known;
        }
        if (shape.numel() != numel())
            detail::fail("dl::reshape: cannot reshape ", shape_, " (", numel(), " elements) into ", shape, " (",
                         shape.numel(), " elements)");
        return shape;
    }

    // Strides for `shape` over the same memory, if the elements are laid out compatibly (each group of
    // old dimensions merged or split must be contiguous within itself), as torch's computeStride.
    [[nodiscard]] std::optional<Strides> view_strides(const Shape& shape) const {
        Strides out = Dims::filled(shape.size(), 1);
        if (numel() == 0) return contiguous_strides(shape);
        int view_d = shape.size() - 1;
        std::int64_t chunk_stride = rank() ? strides_.back() : 1, tensor_numel = 1, view_numel = 1;
        for (int d = rank() - 1; d >= 0; --d) {
            tensor_numel *= shape_[d];
            if (d == 0 || (shape_[d - 1] != 1 && strides_[d - 1] != tensor_numel * chunk_stride)) {
                while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                    out[view_d] = view_numel * chunk_stride;
                    view_numel *= shape[view_d];
                    --view_d;
                }
                if (view_numel != tensor_numel) return std::nullopt;
                if (d > 0) {
                    chunk_stride = strides_[d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        for (; view_d >= 0; --view_d) out[view_d] = 1;  // leading size-1 dimensions
        return out;
    }

    Storage storage_;
    T* base_ = nullptr;
    Shape shape_;
    Strides strides_;
    std::int64_t offset_ = 0;
    Context* ctx_ = nullptr;
    detail::grad_ref grad_;
};

/// A view of user memory; contiguous row-major when no strides are given.
template <element T>
[[nodiscard]] Tensor<T> from_blob(T* data, const Shape& shape, Context& ctx = default_context()) {
    return Tensor<T>::borrow(data, shape, contiguous_strides(shape), ctx);
}
template <element T>
[[nodiscard]] Tensor<T> from_blob(T* data, const Shape& shape, const Strides& strides, Context& ctx = default_context()) {
    return Tensor<T>::borrow(data, shape, strides, ctx);
}

}  // namespace dl
