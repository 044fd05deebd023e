// Every float bit pattern narrowed to bfloat16 and float16, and every 16-bit pattern widened, against
// an independent reference written here: decode the float into sign, exponent and integer significand,
// round the significand to the target's precision with integer arithmetic (to nearest, ties to even),
// encode. It shares no code or trick with core/half.hpp. Each path this machine can run is checked: the
// scalar constructors, the SIMD store/load of the expression loops (native instructions), the portable
// SIMD path, the 8-lane AVX2/F16C narrowing an AVX-512 build would otherwise skip, and whole tensors
// through assign.
#include "support.hpp"

#include <atomic>
#include <cstdio>
#include <string>
#include <bit>
#include <cmath>
#include <thread>
#include <vector>

namespace {

std::string hex(std::uint32_t bits) {
    char text[12];
    std::snprintf(text, sizeof text, "0x%x", bits);
    return text;
}

/// float bits → bits of the format with E exponent bits and M mantissa bits.
template <int E, int M>
std::uint16_t reference_narrow(std::uint32_t u) {
    constexpr int bias = (1 << (E - 1)) - 1, emin = 1 - bias, max_field = (1 << E) - 1;
    const std::uint32_t sign = (u >> 31) << 15, field = (u >> 23) & 0xff, fraction = u & 0x7fffff;
    if (field == 0xff) {
        if (fraction == 0) return static_cast<std::uint16_t>(sign | (max_field << M));
        // NaN: quiet bit set, the top M-1 bits of the payload kept.
        return static_cast<std::uint16_t>(sign | (max_field << M) | (1u << (M - 1)) |
                                          ((fraction >> (23 - M)) & ((1u << (M - 1)) - 1)));
    }
    if (field == 0 && fraction == 0) return static_cast<std::uint16_t>(sign);
    // value = significand · 2^scale exactly.
    const std::uint64_t significand = field ? (fraction | 0x800000u) : fraction;
    const int scale = field ? static_cast<int>(field) - 150 : -149;
    const int leading = 63 - std::countl_zero(significand);
    // The target's last place for this value: 2^lsb.
    int lsb = std::max(leading + scale, emin) - M;
    const int shift = lsb - scale;  // ≥ 1 for both formats
    std::uint64_t q = 0;
    if (shift < 40) {
        q = significand >> shift;
        const std::uint64_t rest = significand - (q << shift), half = std::uint64_t{1} << (shift - 1);
        if (rest > half || (rest == half && (q & 1))) ++q;
    }
    if (q == (std::uint64_t{1} << (M + 1))) {  // rounding carried into the next binade
        q >>= 1;
        ++lsb;
    }
    if (q < (std::uint64_t{1} << M)) return static_cast<std::uint16_t>(sign | q);  // subnormal (or zero)
    const int exponent_field = lsb + M + bias;
    if (exponent_field >= max_field) return static_cast<std::uint16_t>(sign | (max_field << M));
    return static_cast<std::uint16_t>(sign | (std::uint32_t(exponent_field) << M) | (q - (std::uint64_t{1} << M)));
}

/// 16-bit bits → the value as a double (NaN: a NaN with the given sign), by the format's definition.
template <int E, int M>
double reference_widen(std::uint16_t h) {
    constexpr int bias = (1 << (E - 1)) - 1, max_field = (1 << E) - 1;
    const int field = (h >> M) & max_field;
    const std::uint32_t fraction = h & ((1u << M) - 1);
    const double sign = (h >> 15) ? -1.0 : 1.0;
    if (field == max_field) return fraction ? std::copysign(NAN, sign) : sign * INFINITY;
    if (field == 0) return sign * std::ldexp(double(fraction), 1 - bias - M);
    return sign * std::ldexp(double(fraction | (1u << M)), field - bias - M);
}

/// Runs check(first_bits, count) over all 2^32 patterns in blocks on every core, each worker with its
/// own copy of `check` (and so of its buffers); returns the number of mismatches it reported.
template <class Check>
std::uint64_t over_all_floats(const Check& prototype) {
    constexpr std::uint64_t block = 1 << 16, blocks = (std::uint64_t{1} << 32) / block;
    // The sanitizer build walks every 97th block (still all exponents and every tail shape).
    const std::uint64_t step = dl_test::quick() ? 97 : 1;
    std::atomic<std::uint64_t> next{0}, wrong{0};
    std::vector<std::thread> workers;
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned t = 0; t < threads; ++t)
        workers.emplace_back([&] {
            Check check = prototype;
            for (std::uint64_t b; (b = next.fetch_add(step)) < blocks;)
                wrong += check(static_cast<std::uint32_t>(b * block), static_cast<std::uint32_t>(block));
        });
    for (auto& w : workers) w.join();
    return wrong;
}

template <class H, int E, int M>
void check_all_narrowing() {
    std::atomic<int> reported{0};
    constexpr std::size_t block = 1 << 16;
    struct buffers {
        std::vector<float> in = std::vector<float>(block);
        std::vector<std::uint16_t> expected = std::vector<std::uint16_t>(block), scalar = expected;
        std::vector<H> native = std::vector<H>(block), portable = native;
        std::vector<std::uint16_t> narrow = std::vector<std::uint16_t>(block);  // 8-lane path, or a copy of native
    };
    const auto wrong = over_all_floats([&, b = buffers{}](std::uint32_t first, std::uint32_t count) mutable {
        // One simple loop per path, so that the compiler vectorises what it can.
        for (std::uint32_t i = 0; i < count; ++i) b.in[i] = std::bit_cast<float>(first + i);
        for (std::uint32_t i = 0; i < count; ++i) b.expected[i] = reference_narrow<E, M>(first + i);
        for (std::uint32_t i = 0; i < count; ++i) b.scalar[i] = std::bit_cast<std::uint16_t>(H(b.in[i]));
        constexpr int W = dl::simd::width<float>;
        for (std::uint32_t i = 0; i < count; i += W) {
            dl::simd::store_compute<H, true>(b.native.data() + i, dl::simd::load(b.in.data() + i));
            dl::simd::store_compute<H, false>(b.portable.data() + i, dl::simd::load(b.in.data() + i));
        }
        // The 8-lane (AVX2 / F16C) path, which AVX-512 targets otherwise never take.
        for (std::uint32_t i = 0; i < count; ++i) b.narrow[i] = b.native[i].bits();
#if defined(__AVX2__)
        for (std::uint32_t i = 0; i < count; i += 8) {
            auto* out = reinterpret_cast<__m128i*>(b.narrow.data() + i);
            const __m256 x = _mm256_loadu_ps(b.in.data() + i);
            if constexpr (std::is_same_v<H, dl::bfloat16>)
                _mm_storeu_si128(out, dl::simd::detail::bfloat16_bits_avx2(x));
#if defined(__F16C__)
            else
                _mm_storeu_si128(out, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
        }
#endif
        std::uint64_t bad = 0;
        for (std::uint32_t i = 0; i < count; ++i)
            bad += (b.scalar[i] != b.expected[i]) | (b.native[i].bits() != b.expected[i]) |
                   (b.portable[i].bits() != b.expected[i]) | (b.narrow[i] != b.expected[i]);
        for (std::uint32_t i = 0; bad && i < count; ++i)
            if ((b.scalar[i] != b.expected[i] || b.native[i].bits() != b.expected[i] ||
                 b.portable[i].bits() != b.expected[i] || b.narrow[i] != b.expected[i]) &&
                reported++ < 5)
                MESSAGE("float bits ", hex(first + i), ": reference ", hex(b.expected[i]), " scalar ", hex(b.scalar[i]),
                        " native ", hex(b.native[i].bits()), " portable ", hex(b.portable[i].bits()), " 8-lane ",
                        hex(b.narrow[i]));
        return bad;
    });
    CHECK(wrong == 0);
}

template <class H, int E, int M>
void check_all_widening() {
    int wrong = 0;
    std::vector<H> in(1 << 16);
    for (std::uint32_t b = 0; b < (1u << 16); ++b) in[b] = H::from_bits(static_cast<std::uint16_t>(b));
    std::vector<float> native(1 << 16), portable(1 << 16);
    constexpr int W = dl::simd::width<float>;
    for (std::size_t i = 0; i < in.size(); i += W) {
        dl::simd::store(native.data() + i, dl::simd::load_compute<H, true>(in.data() + i));
        dl::simd::store(portable.data() + i, dl::simd::load_compute<H, false>(in.data() + i));
    }
    for (std::uint32_t b = 0; b < (1u << 16); ++b) {
        const double expected = reference_widen<E, M>(static_cast<std::uint16_t>(b));
        const float scalar = static_cast<float>(in[b]);
        for (const float got : {scalar, native[b], portable[b]}) {
            const auto bits = std::bit_cast<std::uint32_t>(got);
            bool ok;
            if (std::isnan(expected)) {
                // Same sign, the payload in the top bits, quiet (bfloat16 keeps even a signalling NaN's bits).
                const std::uint32_t payload = (b & ((1u << M) - 1)) << (23 - M);
                const std::uint32_t quiet = std::is_same_v<H, dl::bfloat16> ? 0 : 0x400000u;
                ok = bits == (((b >> 15) << 31) | 0x7f800000u | payload | quiet);
            } else {
                ok = std::bit_cast<std::uint64_t>(double(got)) == std::bit_cast<std::uint64_t>(expected);
            }
            if (!ok && wrong++ < 5) MESSAGE("16-bit ", hex(b), " widened to float bits ", hex(bits));
        }
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("bfloat16: every float narrows as the reference rounds it, on every path") {
    check_all_narrowing<dl::bfloat16, 8, 7>();
}
TEST_CASE("float16: every float narrows as the reference rounds it, on every path") {
    check_all_narrowing<dl::float16, 5, 10>();
}
TEST_CASE("bfloat16 and float16: every 16-bit pattern widens exactly, on every path") {
    check_all_widening<dl::bfloat16, 8, 7>();
    check_all_widening<dl::float16, 5, 10>();
}

TEST_CASE("16-bit floats: narrowing round trips every non-NaN pattern") {
    for (std::uint32_t b = 0; b < (1u << 16); ++b) {
        const auto bf = dl::bfloat16::from_bits(std::uint16_t(b));
        const auto h = dl::float16::from_bits(std::uint16_t(b));
        if (!std::isnan(float(bf))) REQUIRE(dl::bfloat16(float(bf)).bits() == b);
        if (!std::isnan(float(h))) REQUIRE(dl::float16(float(h)).bits() == b);
        if (!std::isnan(float(h))) REQUIRE(dl::float16(double(float(h))).bits() == b);
    }
}

TEST_CASE("16-bit tensors: assign converts whole tensors on the native path, tails and strides included") {
    dl::Context ctx({.seed = 3, .threads = 2});
    for (std::int64_t n : {0, 1, 15, 17, 100003}) {
        CAPTURE(n);
        const auto x = dl::normal<float>({n}, 0, 1e3, ctx);
        const dl::Tensor<dl::bfloat16> b = dl::cast<dl::bfloat16>(x);
        const dl::Tensor<dl::float16> h = dl::cast<dl::float16>(x);
        for (std::int64_t i = 0; i < n; ++i) {
            REQUIRE(b.data()[i].bits() == dl::bfloat16(x.data()[i]).bits());
            REQUIRE(h.data()[i].bits() == dl::float16(x.data()[i]).bits());
        }
        const dl::Tensor<float> back = dl::cast<float>(b);
        for (std::int64_t i = 0; i < n; ++i) REQUIRE(back.data()[i] == float(b.data()[i]));
    }
    // A transposed (non-contiguous) source takes the strided loop.
    const auto m = dl::normal<float>({37, 19}, 0, 1, ctx);
    const dl::Tensor<dl::bfloat16> t = dl::cast<dl::bfloat16>(m.transpose(0, 1));
    for (std::int64_t i = 0; i < 19; ++i)
        for (std::int64_t j = 0; j < 37; ++j) REQUIRE(t(i, j).bits() == dl::bfloat16(m(j, i)).bits());
}
