#pragma once
// Shape and strides: a fixed-capacity array of int64 extents. Fixed capacity keeps tensors and views
// free of heap allocations.
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <span>
#include <string_view>

#include "error.hpp"

namespace dl {

inline constexpr int max_rank = 8;

class Dims {
public:
    constexpr Dims() = default;
    constexpr Dims(std::initializer_list<std::int64_t> values) { assign(values.begin(), values.end()); }
    constexpr explicit Dims(std::span<const std::int64_t> values) { assign(values.begin(), values.end()); }
    /// `rank` copies of `value`.
    [[nodiscard]] static constexpr Dims filled(int rank, std::int64_t value) {
        Dims d;
        d.resize(rank, value);
        return d;
    }

    [[nodiscard]] constexpr int size() const noexcept { return static_cast<int>(rank_); }
    [[nodiscard]] constexpr bool empty() const noexcept { return rank_ == 0; }
    [[nodiscard]] constexpr std::int64_t& operator[](int i) noexcept { return v_[static_cast<std::size_t>(i)]; }
    [[nodiscard]] constexpr std::int64_t operator[](int i) const noexcept { return v_[static_cast<std::size_t>(i)]; }
    [[nodiscard]] constexpr std::int64_t* begin() noexcept { return v_.data(); }
    [[nodiscard]] constexpr std::int64_t* end() noexcept { return v_.data() + rank_; }
    [[nodiscard]] constexpr const std::int64_t* begin() const noexcept { return v_.data(); }
    [[nodiscard]] constexpr const std::int64_t* end() const noexcept { return v_.data() + rank_; }
    [[nodiscard]] constexpr std::int64_t back() const noexcept { return v_[static_cast<std::size_t>(rank_ - 1)]; }

    constexpr void push_back(std::int64_t value) {
        if (rank_ == max_rank) detail::fail("dl: rank exceeds the maximum of ", max_rank);
        v_[static_cast<std::size_t>(rank_++)] = value;
    }
    constexpr void insert(int pos, std::int64_t value) {
        push_back(0);
        for (int i = size() - 1; i > pos; --i) (*this)[i] = (*this)[i - 1];
        (*this)[pos] = value;
    }
    constexpr void erase(int pos) {
        for (int i = pos; i + 1 < rank_; ++i) (*this)[i] = (*this)[i + 1];
        --rank_;
    }
    constexpr void resize(int rank, std::int64_t value = 0) {
        if (rank < 0 || rank > max_rank) detail::fail("dl: rank ", rank, " outside [0, ", max_rank, "]");
        for (int i = size(); i < rank; ++i) v_[static_cast<std::size_t>(i)] = value;
        rank_ = rank;
    }

    /// Product of the extents (1 for rank 0).
    [[nodiscard]] constexpr std::int64_t numel() const noexcept {
        std::int64_t n = 1;
        for (auto e : *this) n *= e;
        return n;
    }
    /// Product of the extents, or nullopt when an extent is negative or the product overflows int64
    /// (zero extents counted as 1 there, so that strides from the shape fit too). For shapes read from
    /// files and sockets; numel() stays unchecked, as it runs for every tensor and view made.
    [[nodiscard]] constexpr std::optional<std::int64_t> checked_numel() const noexcept {
        std::int64_t n = 1;
        bool zero = false;
        for (auto e : *this) {
            if (e < 0 || __builtin_mul_overflow(n, std::max<std::int64_t>(e, 1), &n)) return std::nullopt;
            zero = zero || e == 0;
        }
        return zero ? 0 : n;
    }

    friend constexpr bool operator==(const Dims& a, const Dims& b) noexcept {
        // A loop, not std::equal: that becomes a call to memcmp, which costs more than these few extents.
        if (a.rank_ != b.rank_) return false;
        for (int i = 0; i < a.rank_; ++i)
            if (a[i] != b[i]) return false;
        return true;
    }
    friend std::ostream& operator<<(std::ostream& out, const Dims& d) {
        out << '[';
        for (int i = 0; i < d.size(); ++i) out << (i ? ", " : "") << d[i];
        return out << ']';
    }

private:
    template <class It>
    constexpr void assign(It first, It last) {
        for (; first != last; ++first) push_back(*first);
    }
    std::array<std::int64_t, max_rank> v_{};
    // 8 bytes, not an int and 4 of padding: GCC copies a Dims by 8-byte words, and such a load of a
    // rank just written by a 4-byte store cannot be forwarded from the store, a stall on each tensor
    // or view made from a fresh one (batch-1 SGD step of the 16-64-64-4 MLP: 4.03 -> 3.80 us).
    std::int64_t rank_ = 0;
};

using Shape = Dims;
using Strides = Dims;

/// Row-major (C order) strides of a shape, in elements.
[[nodiscard]] constexpr Strides contiguous_strides(const Shape& shape) {
    Strides s = Dims::filled(shape.size(), 1);
    for (int i = shape.size() - 2; i >= 0; --i) s[i] = s[i + 1] * std::max<std::int64_t>(shape[i + 1], 1);
    return s;
}

/// numpy broadcasting of two shapes; throws naming `op` and both shapes when they do not broadcast.
[[nodiscard]] inline Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
    if (a == b || b.empty()) return a;  // the common cases: same shapes, or a scalar operand
    if (a.empty()) return b;
    const int rank = std::max(a.size(), b.size());
    Shape out = Dims::filled(rank, 1);
    for (int i = 0; i < rank; ++i) {
        const int ia = a.size() - rank + i, ib = b.size() - rank + i;
        const std::int64_t ea = ia >= 0 ? a[ia] : 1, eb = ib >= 0 ? b[ib] : 1;
        if (ea != eb && ea != 1 && eb != 1)
            detail::fail("dl::", op, ": shapes ", a, " and ", b, " do not broadcast (dimension ", i, ": ", ea,
                         " vs ", eb, ")");
        out[i] = ea == 1 ? eb : ea;
    }
    return out;
}

/// Normalises a possibly negative dimension index against `rank`.
[[nodiscard]] inline int wrap_dim(std::int64_t dim, int rank, std::string_view op) {
    if (dim < -rank || dim >= rank)
        detail::fail("dl::", op, ": dimension ", dim, " out of range for rank ", rank);
    return static_cast<int>(dim < 0 ? dim + rank : dim);
}

}  // namespace dl
