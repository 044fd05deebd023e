// dl::bfloat16 and dl::float16 as scalar types: representation, constexpr conversions, the rounding
// rules at their edges (ties, overflow, subnormals, −0, NaN sign), double and integer sources rounding
// once, arithmetic, limits, hashing, printing and literals.
#include "support.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <sstream>
#include <unordered_set>

using dl::bfloat16;
using dl::float16;
using namespace dl::literals;

namespace {
template <class H>
constexpr std::uint16_t bits(H x) {
    return std::bit_cast<std::uint16_t>(x);
}
}  // namespace

// Representation and constexpr: everything here is checked at compile time.
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(bits(bfloat16(1.0f)) == 0x3f80 && bits(float16(1.0f)) == 0x3c00);
static_assert(std::bit_cast<bfloat16>(std::uint16_t{0x4049}) == bfloat16(3.140625f));
static_assert(static_cast<float>(float16::from_bits(0x3555)) == 0.333251953125f);
static_assert(bits(1.5_bf16) == 0x3fc0 && bits(1.5_f16) == 0x3e00 && bits(3_f16) == 0x4200);
static_assert(float(bfloat16(2.0f) * bfloat16(3.0f)) == 6.0f);
static_assert(dl::dtype_of<bfloat16> == dl::DType::bfloat16 && dl::dtype_of<float16> == dl::DType::float16);
static_assert(std::is_same_v<dl::compute_t<bfloat16>, float> && dl::is_floating_element<float16>);
static_assert(std::is_same_v<dl::promote_t<bfloat16, bfloat16>, bfloat16> &&
              std::is_same_v<dl::promote_t<bfloat16, std::int32_t>, bfloat16> &&
              std::is_same_v<dl::promote_t<bool, float16>, float16> &&
              std::is_same_v<dl::promote_t<float16, float>, float> &&
              std::is_same_v<dl::promote_t<double, bfloat16>, double> &&
              std::is_same_v<dl::promote_t<bfloat16, float16>, float>);

TEST_CASE("16-bit floats: ties round to even, overflow to Inf, −0 and Inf kept") {
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7 in bfloat16: to even (1); 1 + 3·2^-8: up.
    CHECK(bits(bfloat16(1.0f + 0x1p-8f)) == 0x3f80);
    CHECK(bits(bfloat16(1.0f + 3 * 0x1p-8f)) == 0x3f82);
    CHECK(bits(bfloat16(1.0f + 0x1p-8f + 0x1p-20f)) == 0x3f81);  // just past the tie
    CHECK(bits(float16(1.0f + 0x1p-11f)) == 0x3c00);
    CHECK(bits(float16(1.0f + 3 * 0x1p-11f)) == 0x3c02);
    // Largest finite values, and the first values that round past them.
    CHECK(float(std::numeric_limits<float16>::max()) == 65504.0f);
    CHECK(bits(float16(65519.0f)) == 0x7bff);
    CHECK(bits(float16(65520.0f)) == 0x7c00);
    CHECK(bits(float16(-1e9f)) == 0xfc00);
    CHECK(bits(bfloat16(std::numeric_limits<float>::max())) == 0x7f80);
    CHECK(bits(bfloat16(-INFINITY)) == 0xff80);
    CHECK(bits(bfloat16(-0.0f)) == 0x8000);
    CHECK(bits(float16(-0.0f)) == 0x8000);
    CHECK(bits(float16(-0.0)) == 0x8000);
}

TEST_CASE("16-bit floats: subnormals round exactly") {
    // float16's smallest subnormal is 2^-24; half of it ties to even (0), a hair more rounds up.
    CHECK(bits(float16(0x1p-24f)) == 0x0001);
    CHECK(bits(float16(0x1p-25f)) == 0x0000);
    CHECK(bits(float16(0x1.000002p-25f)) == 0x0001);
    CHECK(bits(float16(3 * 0x1p-25f)) == 0x0002);  // 1.5 units: to even
    CHECK(bits(float16(-0x1p-26f)) == 0x8000);
    CHECK(bits(float16(0x1.ffcp-15f)) == 0x0400);  // the largest subnormal plus half a unit: the smallest normal
    CHECK(float(float16::from_bits(0x03ff)) == 1023 * 0x1p-24f);
    // bfloat16 shares float's subnormal range.
    CHECK(bits(bfloat16(0x1p-133f)) == 0x0001);
    CHECK(bits(bfloat16(0x1p-134f)) == 0x0000);
    CHECK(bits(bfloat16(std::numeric_limits<float>::denorm_min())) == 0x0000);
    CHECK(float(bfloat16::from_bits(0x0001)) == 0x1p-133f);
}

TEST_CASE("16-bit floats: NaN keeps its sign and payload and becomes quiet") {
    const float negative_nan = std::bit_cast<float>(0xffa00001u);  // signalling, negative
    CHECK(bits(bfloat16(negative_nan)) == 0xffe0);
    CHECK(bits(float16(negative_nan)) == 0xff00);
    CHECK(bits(bfloat16(std::bit_cast<float>(0x7f800001u))) == 0x7fc0);  // payload only in the cut bits
    CHECK(std::isnan(float(bfloat16(std::nan("")))));
    CHECK(std::signbit(float(float16(-std::nan("")))));
    CHECK(bits(bfloat16(std::bit_cast<double>(0xfff4000000000000ull))) == 0xffe0);
    CHECK(std::isnan(float(float16::from_bits(0x7c01))));
}

TEST_CASE("16-bit floats: a double rounds once, not through float") {
    // 1 + 2^-8 + 2^-30 is just above the bfloat16 tie: rounds up. Through float it would first round to
    // 1 + 2^-8 (the tie) and then to even: 1.
    const double above_tie = 1.0 + 0x1p-8 + 0x1p-30;
    CHECK(bits(bfloat16(static_cast<float>(above_tie))) == 0x3f80);
    CHECK(bits(bfloat16(above_tie)) == 0x3f81);
    const double below_tie = 1.0 + 0x1p-8 - 0x1p-30;
    CHECK(bits(bfloat16(below_tie)) == 0x3f80);
    CHECK(bits(float16(1.0 + 0x1p-11 + 0x1p-40)) == 0x3c01);
    CHECK(bits(float16(0x1p-25 + 0x1p-60)) == 0x0001);
    CHECK(bits(float16(1e300)) == 0x7c00);
    CHECK(bits(bfloat16(1e300)) == 0x7f80);
    CHECK(bits(bfloat16(-1e-300)) == 0x8000);
    // Every bfloat16 tie between consecutive values, nudged by far less than float can hold.
    for (std::uint16_t b = 0x0080; b < 0x7f7f; b += 97) {
        const double lo = float(bfloat16::from_bits(b)), hi = float(bfloat16::from_bits(std::uint16_t(b + 1)));
        const double mid = (lo + hi) / 2, nudge = (hi - lo) * 0x1p-30;
        REQUIRE(bits(bfloat16(mid + nudge)) == b + 1);
        REQUIRE(bits(bfloat16(mid - nudge)) == b);
    }
}

TEST_CASE("16-bit floats: integers convert with one rounding") {
    CHECK(bits(bfloat16(257)) == 0x4380);      // 257 ties between 256 and 258: to even, 256
    CHECK(bits(bfloat16(259)) == 0x4382);      // 259 ties between 258 and 260: to 260
    CHECK(bits(float16(2049)) == 0x6800);      // 2048
    CHECK(bits(float16(70000)) == 0x7c00);
    CHECK(bits(float16(std::int64_t{-3})) == 0xc200);
    // 2^62 + 2^54 + 1: above the tie between 2^62 and the next bfloat16, though double would round
    // 2^54 + 1 away.
    const std::int64_t big = (std::int64_t{1} << 62) + (std::int64_t{1} << 54) + 1;
    CHECK(bits(bfloat16(big)) == 0x5e81);
    CHECK(bits(bfloat16(std::numeric_limits<std::int64_t>::min())) == 0xdf00);
    CHECK(bits(bfloat16(std::numeric_limits<std::uint64_t>::max())) == 0x5f80);
}

TEST_CASE("16-bit floats: arithmetic and comparisons go through float") {
    const bfloat16 a(1.0f), b(0x1p-8f);
    CHECK(bits(a + b) == 0x3f80);  // 1 + 2^-8 rounds back to 1
    CHECK(bits(a - b) == 0x3f7f);
    CHECK(float(bfloat16(3.0f) / bfloat16(2.0f)) == 1.5f);
    CHECK(bits(-bfloat16(0.0f)) == 0x8000);
    float16 x(1.0f);
    x += float16(2.0f);
    x *= float16(4.0f);
    CHECK(float(x) == 12.0f);
    CHECK(bfloat16(1.0f) < bfloat16(2.0f));
    CHECK(bfloat16(0.0f) == -bfloat16(0.0f));
    const bfloat16 nan = std::numeric_limits<bfloat16>::quiet_NaN();
    CHECK_FALSE(nan == nan);
    CHECK_FALSE(nan < a);
    // Mixed with float, the float wins.
    static_assert(std::is_same_v<decltype(bfloat16(1.0f) + 1.0f), float>);
    CHECK(bfloat16(1.0f) + 0x1p-20f == 1.0f + 0x1p-20f);
    CHECK(nextafter(bfloat16(1.0f), bfloat16(2.0f)).bits() == 0x3f81);
    CHECK(nextafter(bfloat16(1.0f), bfloat16(0.0f)).bits() == 0x3f7f);
    CHECK(nextafter(float16(-0.0f), float16(1.0f)).bits() == 0x0001);
    CHECK(nextafter(float16(-1.0f), float16(-2.0f)).bits() == 0xbc01);
}

TEST_CASE_TEMPLATE("16-bit floats: numeric_limits", H, bfloat16, float16) {
    using L = std::numeric_limits<H>;
    static_assert(L::is_specialized && L::has_infinity && L::has_quiet_NaN && L::radix == 2);
    constexpr bool bf = std::is_same_v<H, bfloat16>;
    CHECK(L::digits == (bf ? 8 : 11));
    CHECK(L::digits10 == (bf ? 2 : 3));
    CHECK(L::max_digits10 == (bf ? 4 : 5));
    CHECK(float(L::epsilon()) == (bf ? 0x1p-7f : 0x1p-10f));
    CHECK(float(L::min()) == (bf ? 0x1p-126f : 0x1p-14f));
    CHECK(float(L::max()) == (bf ? 0x1.fep127f : 65504.0f));
    CHECK(float(L::lowest()) == -float(L::max()));
    CHECK(float(L::denorm_min()) == (bf ? 0x1p-133f : 0x1p-24f));
    CHECK(float(L::infinity()) == INFINITY);
    CHECK(std::isnan(float(L::quiet_NaN())));
    CHECK(std::isnan(float(L::signaling_NaN())));
    CHECK(float(L::round_error()) == 0.5f);
    // epsilon is the gap above 1, and max the largest finite: one step further is Inf.
    CHECK(float(nextafter(H(1.0f), H(2.0f))) - 1.0f == float(L::epsilon()));
    CHECK(std::isinf(float(H::from_bits(std::uint16_t(L::max().bits() + 1)))));
    CHECK(L::max_exponent == (bf ? 128 : 16));
    CHECK(L::min_exponent == (bf ? -125 : -13));
}

TEST_CASE_TEMPLATE("16-bit floats: hash, printing and formatting", H, bfloat16, float16) {
    std::unordered_set<H> seen{H(1.0f), H(2.0f), H(1.0f), H(0.0f), -H(0.0f)};
    CHECK(seen.size() == 3);  // 1, 2 and ±0 (equal values hash equal)
    CHECK(std::hash<H>{}(H(0.0f)) == std::hash<H>{}(-H(0.0f)));
    std::ostringstream out;
    out << H(1.5f) << ' ' << H(-0.25f) << ' ' << std::numeric_limits<H>::infinity();
    CHECK(out.str() == "1.5 -0.25 inf");
#if defined(__cpp_lib_format)
    CHECK(std::format("{:.2f}", H(1.5f)) == "1.50");
#endif
}
