#pragma once
// Element types. A type is a tensor element when dtype_traits<T> is specialised for it; the 16-bit
// float types add their own specialisations (compute_type = float) without touching this file.
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

namespace dl {

enum class DType : std::uint8_t { boolean, uint8, int32, int64, float32, float64, bfloat16, float16 };

[[nodiscard]] constexpr std::string_view dtype_name(DType d) noexcept {
    switch (d) {
        case DType::boolean: return "bool";
        case DType::uint8: return "uint8";
        case DType::int32: return "int32";
        case DType::int64: return "int64";
        case DType::float32: return "float32";
        case DType::float64: return "float64";
        case DType::bfloat16: return "bfloat16";
        case DType::float16: return "float16";
    }
    return "unknown";
}

/// Bytes per element.
[[nodiscard]] constexpr std::size_t dtype_size(DType d) noexcept {
    switch (d) {
        case DType::boolean:
        case DType::uint8: return 1;
        case DType::bfloat16:
        case DType::float16: return 2;
        case DType::int32:
        case DType::float32: return 4;
        case DType::int64:
        case DType::float64: return 8;
    }
    return 0;
}

inline std::ostream& operator<<(std::ostream& out, DType d) { return out << dtype_name(d); }

// compute_type: the type arithmetic happens in. For storage-only types (bfloat16, float16) it is
// float, so a fused chain rounds once, on store.
template <class T>
struct dtype_traits {
    static constexpr bool supported = false;
};

#define DL_DEFINE_DTYPE(Type, Enum)                \
    template <>                                    \
    struct dtype_traits<Type> {                    \
        static constexpr bool supported = true;    \
        static constexpr DType dtype = DType::Enum; \
        using compute_type = Type;                 \
    }
DL_DEFINE_DTYPE(bool, boolean);
DL_DEFINE_DTYPE(std::uint8_t, uint8);
DL_DEFINE_DTYPE(std::int32_t, int32);
DL_DEFINE_DTYPE(std::int64_t, int64);
DL_DEFINE_DTYPE(float, float32);
DL_DEFINE_DTYPE(double, float64);
#undef DL_DEFINE_DTYPE

/// A type a Tensor can hold.
template <class T>
concept element = dtype_traits<std::remove_cv_t<T>>::supported;

template <element T>
using compute_t = typename dtype_traits<T>::compute_type;

template <element T>
inline constexpr DType dtype_of = dtype_traits<T>::dtype;

template <class T>
inline constexpr bool is_floating_element = std::is_floating_point_v<compute_t<T>>;

namespace detail {
// Result type of mixing two element types: the wider float, else the wider integer; bool loses to
// anything. Specialised for the 16-bit floats in their header.
template <class A, class B>
struct promote {
    using type = std::conditional_t<std::is_same_v<A, B>, A, std::common_type_t<A, B>>;
};
template <class B>
struct promote<bool, B> {
    using type = B;
};
template <class A>
    requires(!std::is_same_v<A, bool>)
struct promote<A, bool> {
    using type = A;
};
}  // namespace detail

template <class A, class B>
using promote_t = typename detail::promote<A, B>::type;

}  // namespace dl
