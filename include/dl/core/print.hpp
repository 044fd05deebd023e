#pragma once
// operator<< for tensors, numpy style: nested brackets, aligned columns, and "..." in place of the
// middle of any dimension longer than 6 when the tensor has more than 1000 elements.
#include <algorithm>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "tensor.hpp"

namespace dl {

namespace detail {
inline constexpr std::int64_t print_threshold = 1000, print_edge = 3;

template <class T>
std::string format_element(T v) {
    std::ostringstream s;
    if constexpr (std::is_same_v<T, bool>)
        s << (v ? "true" : "false");
    else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int8_t>)
        s << static_cast<int>(v);
    else if constexpr (std::is_floating_point_v<compute_t<T>>)
        s << static_cast<compute_t<T>>(v);
    else
        s << v;
    return s.str();
}

template <class T>
void print_dim(std::ostream& out, const Tensor<T>& t, int dim, const T* p, bool summarise, std::size_t width,
               int indent) {
    if (dim == t.rank()) {
        const std::string s = format_element(*p);
        out << std::string(width - std::min(width, s.size()), ' ') << s;
        return;
    }
    const std::int64_t n = t.shape()[dim];
    out << '[';
    for (std::int64_t i = 0; i < n; ++i) {
        if (summarise && n > 2 * print_edge && i == print_edge) {
            if (dim + 1 == t.rank())
                out << "..., ";
            else
                out << "...," << std::string(static_cast<std::size_t>(t.rank() - dim - 1), '\n')
                    << std::string(static_cast<std::size_t>(indent + 1), ' ');
            i = n - print_edge - 1;
            continue;
        }
        print_dim(out, t, dim + 1, p + i * t.strides()[dim], summarise, width, indent + 1);
        if (i + 1 < n) {
            if (dim + 1 == t.rank())
                out << ", ";
            else
                out << ',' << std::string(static_cast<std::size_t>(t.rank() - dim - 1), '\n')
                    << std::string(static_cast<std::size_t>(indent + 1), ' ');
        }
    }
    out << ']';
}
}  // namespace detail

template <element T>
std::ostream& operator<<(std::ostream& out, const Tensor<T>& t) {
    out << "tensor(" << t.dtype() << ", shape=" << t.shape() << ")";
    if (!t.defined()) return out << " null";
    out << '\n';
    const bool summarise = t.numel() > detail::print_threshold;
    std::size_t width = 1;
    // Column width from the elements that will be shown (all of them when not summarising).
    std::vector<std::int64_t> index(static_cast<std::size_t>(t.rank()), 0);
    for (std::int64_t k = 0; k < t.numel(); ++k) {
        bool shown = true;
        std::int64_t pos = 0;
        for (int d = 0; d < t.rank(); ++d) {
            const std::int64_t i = index[static_cast<std::size_t>(d)], n = t.shape()[d];
            shown = shown && (!summarise || n <= 2 * detail::print_edge || i < detail::print_edge ||
                              i >= n - detail::print_edge);
            pos += i * t.strides()[d];
        }
        if (shown) width = std::max(width, detail::format_element(t.data()[pos]).size());
        for (int d = t.rank() - 1; d >= 0 && ++index[static_cast<std::size_t>(d)] == t.shape()[d]; --d)
            index[static_cast<std::size_t>(d)] = 0;
    }
    detail::print_dim(out, t, 0, t.data(), summarise, width, 0);
    return out;
}

}  // namespace dl
