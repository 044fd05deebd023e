#pragma once
// The 16-bit floats: dl::bfloat16 (float's 8-bit exponent, 7 mantissa bits) and dl::float16 (IEEE
// binary16: 5-bit exponent, 10 mantissa bits). Both are storage types: arithmetic happens in float and
// the result rounds once, on the way back (dtype_traits<..>::compute_type is float, so a fused chain of
// tensor ops rounds once, on store).
//
// Narrowing (from float, double or an integer) rounds to nearest, ties to even, in one step: ±Inf stay
// Inf, finite values past the largest finite round to Inf by the same rule, −0 stays −0, subnormals
// round exactly. A NaN stays a NaN with its sign and the top bits of its payload, made quiet (what x86's
// vcvtneps2bf16 and vcvtps2ph do). PyTorch's bulk conversion writes every NaN as 0xFFFF, losing the
// sign; dl keeps it.
// Widening to float is exact for every bit pattern. bfloat16 widens by a shift, so even a signalling
// NaN keeps its bits; float16 NaNs widen with their sign and payload and the quiet bit set (vcvtph2ps).
#include <algorithm>
#include <bit>
#include <compare>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <type_traits>

#if __has_include(<format>)
#include <format>
#endif

#include "dtype.hpp"

namespace dl {

namespace detail {

/// Bits of bfloat16(f): float's top half, rounded to nearest even.
[[nodiscard]] constexpr std::uint16_t bfloat16_bits(float f) noexcept {
    const auto u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

[[nodiscard]] constexpr float bfloat16_value(std::uint16_t bits) noexcept {
    return std::bit_cast<float>(std::uint32_t{bits} << 16);
}

/// Bits of float16(f), rounded to nearest even.
[[nodiscard]] constexpr std::uint16_t float16_bits(float f) noexcept {
    const auto u = std::bit_cast<std::uint32_t>(f);
    const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));  // NaN
    if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // ≥ 65520: Inf
    if (a >= 0x38800000u) {  // ≥ 2^-14: normal; rebias the exponent from 127 to 15, round off 13 bits
        a -= 0x38000000u;
        return static_cast<std::uint16_t>(sign | ((a + 0x0fffu + ((a >> 13) & 1u)) >> 13));
    }
    // Subnormal (or zero): the result counts units of 2^-24; a float below 2^-25 rounds to zero.
    const std::uint32_t exponent = a >> 23, shift = 126 - exponent;
    if (shift > 24) return sign;
    const std::uint32_t mantissa = (a & 0x007fffffu) | 0x00800000u;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    std::uint32_t q = mantissa >> shift;
    q += rest > half || (rest == half && (q & 1u));
    return static_cast<std::uint16_t>(sign | q);  // q may carry into the smallest normal: still right
}

[[nodiscard]] constexpr float float16_value(std::uint16_t h) noexcept {
    const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16, exponent = (h >> 10) & 0x1fu,
                        mantissa = h & 0x03ffu;
    if (exponent == 0x1f)  // Inf, or NaN made quiet
        return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0u));
    if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // subnormal: exact
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
}

/// `d` rounded to float "to odd": truncated, with the last bit set when anything was cut off. Rounding
/// that to a format at least two bits narrower (both 16-bit floats are) equals rounding `d` directly,
/// so double → 16-bit rounds once.
[[nodiscard]] constexpr float round_to_odd(double d) noexcept {
    const auto du = std::bit_cast<std::uint64_t>(d);
    if (d != d)  // NaN: sign and top payload bits, quiet
        return std::bit_cast<float>(static_cast<std::uint32_t>((du >> 32) & 0x80000000u) | 0x7fc00000u |
                                    static_cast<std::uint32_t>((du >> 29) & 0x003fffffu));
    const float f = static_cast<float>(d);
    if (static_cast<double>(f) == d) return f;
    auto bits = std::bit_cast<std::uint32_t>(f);
    if ((bits & 1u) == 0) {
        const double fa = f < 0 ? -static_cast<double>(f) : static_cast<double>(f), da = d < 0 ? -d : d;
        bits = fa > da ? bits - 1 : bits + 1;  // one step toward d (sign-magnitude: works past ±Inf and ±0)
    }
    return std::bit_cast<float>(bits);
}

/// An integer as a double rounded to odd (exact below 2^53), for the same single-rounding reason.
template <std::integral I>
[[nodiscard]] constexpr double round_to_odd_double(I i) noexcept {
    bool negative = false;
    if constexpr (std::is_signed_v<I>) negative = i < 0;
    // Magnitude in unsigned arithmetic: -i overflows for the most negative value.
    const auto magnitude = negative ? std::uint64_t{0} - static_cast<std::uint64_t>(i) : static_cast<std::uint64_t>(i);
    const int drop = std::max(0, 11 - std::countl_zero(magnitude));
    std::uint64_t kept = magnitude >> drop;
    if (drop > 0 && (magnitude & ((std::uint64_t{1} << drop) - 1))) kept |= 1;
    const double value = static_cast<double>(kept) * static_cast<double>(std::uint64_t{1} << drop);
    return negative ? -value : value;
}

struct bfloat16_format {
    static constexpr int digits = 8, max_exponent = 128, min_exponent = -125;
    static constexpr std::uint16_t max = 0x7f7f, min = 0x0080, denorm_min = 0x0001, epsilon = 0x3c00,
                                   round_error = 0x3f00, infinity = 0x7f80, quiet_nan = 0x7fc0,
                                   signaling_nan = 0x7fa0;
    static constexpr std::uint16_t bits(float f) noexcept { return bfloat16_bits(f); }
    static constexpr float value(std::uint16_t b) noexcept { return bfloat16_value(b); }
};

struct float16_format {
    static constexpr int digits = 11, max_exponent = 16, min_exponent = -13;
    static constexpr std::uint16_t max = 0x7bff, min = 0x0400, denorm_min = 0x0001, epsilon = 0x1400,
                                   round_error = 0x3800, infinity = 0x7c00, quiet_nan = 0x7e00,
                                   signaling_nan = 0x7d00;
    static constexpr std::uint16_t bits(float f) noexcept { return float16_bits(f); }
    static constexpr float value(std::uint16_t b) noexcept { return float16_value(b); }
};

}  // namespace detail

/// A 16-bit float stored as its bits; Format says how they encode a value (see the two aliases below).
/// Widens to float implicitly (exact); narrows explicitly (rounds).
template <class Format>
class half_float {
public:
    using format = Format;

    half_float() = default;
    constexpr explicit half_float(float f) noexcept : bits_(Format::bits(f)) {}
    constexpr explicit half_float(double d) noexcept : bits_(Format::bits(detail::round_to_odd(d))) {}
    template <std::integral I>
    constexpr explicit half_float(I i) noexcept
        : bits_(Format::bits(detail::round_to_odd(detail::round_to_odd_double(i)))) {}

    constexpr operator float() const noexcept { return Format::value(bits_); }

    /// The value with exactly these bits (same as std::bit_cast).
    [[nodiscard]] static constexpr half_float from_bits(std::uint16_t bits) noexcept {
        return std::bit_cast<half_float>(bits);
    }
    [[nodiscard]] constexpr std::uint16_t bits() const noexcept { return bits_; }

    // Arithmetic in float, rounded once. Mixed with float or double, the wider type wins (the built-in
    // operators, through the conversion above).
    friend constexpr half_float operator+(half_float a, half_float b) noexcept { return half_float(float(a) + float(b)); }
    friend constexpr half_float operator-(half_float a, half_float b) noexcept { return half_float(float(a) - float(b)); }
    friend constexpr half_float operator*(half_float a, half_float b) noexcept { return half_float(float(a) * float(b)); }
    friend constexpr half_float operator/(half_float a, half_float b) noexcept { return half_float(float(a) / float(b)); }
    friend constexpr half_float operator-(half_float a) noexcept { return from_bits(a.bits_ ^ 0x8000u); }
    friend constexpr half_float operator+(half_float a) noexcept { return a; }
    constexpr half_float& operator+=(half_float b) noexcept { return *this = *this + b; }
    constexpr half_float& operator-=(half_float b) noexcept { return *this = *this - b; }
    constexpr half_float& operator*=(half_float b) noexcept { return *this = *this * b; }
    constexpr half_float& operator/=(half_float b) noexcept { return *this = *this / b; }

    // Comparisons are float's (NaN unordered, −0 == +0).
    friend constexpr bool operator==(half_float a, half_float b) noexcept { return float(a) == float(b); }
    friend constexpr std::partial_ordering operator<=>(half_float a, half_float b) noexcept {
        return float(a) <=> float(b);
    }

    /// The next representable value after `from` toward `to` (std::nextafter's rule).
    friend constexpr half_float nextafter(half_float from, half_float to) noexcept {
        if (from != from || to != to) return from_bits(Format::quiet_nan);
        if (from == to) return to;
        if (float(from) == 0)
            return from_bits(static_cast<std::uint16_t>(Format::denorm_min | (to.bits_ & 0x8000u)));
        const bool away_from_zero = (float(from) < float(to)) == (float(from) > 0);
        return from_bits(static_cast<std::uint16_t>(away_from_zero ? from.bits_ + 1 : from.bits_ - 1));
    }

    friend std::ostream& operator<<(std::ostream& out, half_float x) { return out << float(x); }

private:
    std::uint16_t bits_;
};

using bfloat16 = half_float<detail::bfloat16_format>;
using float16 = half_float<detail::float16_format>;

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16>);

template <class T>
inline constexpr bool is_half_float = false;
template <class Format>
inline constexpr bool is_half_float<half_float<Format>> = true;

template <>
struct dtype_traits<bfloat16> {
    static constexpr bool supported = true;
    static constexpr DType dtype = DType::bfloat16;
    using compute_type = float;
};
template <>
struct dtype_traits<float16> {
    static constexpr bool supported = true;
    static constexpr DType dtype = DType::float16;
    using compute_type = float;
};

namespace detail {
// A 16-bit float with an integer (or bool) stays 16-bit, as with PyTorch's tensors; with float or
// double the wider type wins; bfloat16 with float16 meets in float (neither holds the other).
template <class H, class O>
using half_promote = std::conditional_t<std::is_integral_v<O>, H,
                                        std::conditional_t<is_half_float<O>, float, O>>;
template <class A, class B>
    requires(!std::is_same_v<A, B> && (is_half_float<A> || is_half_float<B>) && !std::is_same_v<A, bool> &&
             !std::is_same_v<B, bool>)
struct promote<A, B> {
    using type = std::conditional_t<is_half_float<A>, half_promote<A, B>, half_promote<B, A>>;
};
}  // namespace detail

inline namespace literals {
constexpr bfloat16 operator""_bf16(long double x) noexcept { return bfloat16(static_cast<double>(x)); }
constexpr bfloat16 operator""_bf16(unsigned long long x) noexcept { return bfloat16(x); }
constexpr float16 operator""_f16(long double x) noexcept { return float16(static_cast<double>(x)); }
constexpr float16 operator""_f16(unsigned long long x) noexcept { return float16(x); }
}  // namespace literals

}  // namespace dl

template <class Format>
class std::numeric_limits<dl::half_float<Format>> {
    using H = dl::half_float<Format>;

public:
    static constexpr bool is_specialized = true, is_signed = true, is_integer = false, is_exact = false,
                          has_infinity = true, has_quiet_NaN = true, has_signaling_NaN = true,
                          has_denorm_loss = false, is_iec559 = std::is_same_v<Format, dl::detail::float16_format>,
                          is_bounded = true, is_modulo = false, traps = false, tinyness_before = false;
    static constexpr std::float_denorm_style has_denorm = std::denorm_present;
    static constexpr std::float_round_style round_style = std::round_to_nearest;
    static constexpr int digits = Format::digits, radix = 2, min_exponent = Format::min_exponent,
                         max_exponent = Format::max_exponent;
    // floor((digits - 1) · log10 2) and ceil(1 + digits · log10 2), as for the built-in types.
    static constexpr int digits10 = (digits - 1) * 301 / 1000, max_digits10 = 2 + digits * 301 / 1000;
    static constexpr int min_exponent10 = (min_exponent - 1) * 301 / 1000,
                         max_exponent10 = (max_exponent - 1) * 301 / 1000;
    static constexpr H min() noexcept { return H::from_bits(Format::min); }
    static constexpr H max() noexcept { return H::from_bits(Format::max); }
    static constexpr H lowest() noexcept { return H::from_bits(Format::max | 0x8000u); }
    static constexpr H epsilon() noexcept { return H::from_bits(Format::epsilon); }
    static constexpr H round_error() noexcept { return H::from_bits(Format::round_error); }
    static constexpr H infinity() noexcept { return H::from_bits(Format::infinity); }
    static constexpr H quiet_NaN() noexcept { return H::from_bits(Format::quiet_nan); }
    static constexpr H signaling_NaN() noexcept { return H::from_bits(Format::signaling_nan); }
    static constexpr H denorm_min() noexcept { return H::from_bits(Format::denorm_min); }
};

/// Hash of the value: +0 and −0 compare equal, so they hash equal (NaNs, which equal nothing, by bits).
template <class Format>
struct std::hash<dl::half_float<Format>> {
    std::size_t operator()(dl::half_float<Format> x) const noexcept {
        return std::hash<std::uint16_t>{}(float(x) == 0 ? std::uint16_t{0} : x.bits());
    }
};

#if defined(__cpp_lib_format)
/// Formats as the float it widens to, with float's format specifications.
template <class Format>
struct std::formatter<dl::half_float<Format>, char> : std::formatter<float, char> {
    auto format(dl::half_float<Format> x, std::format_context& ctx) const {
        return std::formatter<float, char>::format(float(x), ctx);
    }
};
#endif
