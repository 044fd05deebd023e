#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): the value at position i of a
// stream is a pure function of (seed, stream offset + i), so a random tensor is the same whatever the
// number of threads that filled it, and any slice of it can be generated independently.
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace dl::detail {

[[nodiscard]] constexpr std::array<std::uint32_t, 4> philox4x32(std::uint64_t key, std::uint64_t counter) noexcept {
    std::uint32_t c0 = static_cast<std::uint32_t>(counter), c1 = static_cast<std::uint32_t>(counter >> 32), c2 = 0,
                  c3 = 0;
    std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
    for (int round = 0; round < 10; ++round) {
        const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * c0, p1 = std::uint64_t{0xCD9E8D57u} * c2;
        const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
        const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return {c0, c1, c2, c3};
}

/// Uniform in [0, 1) with 24 random bits (exactly representable in float).
[[nodiscard]] constexpr float unit_float(std::uint32_t bits) noexcept {
    return static_cast<float>(bits >> 8) * 0x1.0p-24f;
}
/// Uniform in [0, 1) with 53 random bits.
[[nodiscard]] constexpr double unit_double(std::uint32_t hi, std::uint32_t lo) noexcept {
    return static_cast<double>(((std::uint64_t{hi} << 32) | lo) >> 11) * 0x1.0p-53;
}

/// Element `index` of the uniform [0, 1) stream (seed, offset), in double precision.
[[nodiscard]] inline double uniform_at(std::uint64_t seed, std::uint64_t index) noexcept {
    const auto r = philox4x32(seed, index);
    return unit_double(r[0], r[1]);
}

/// Element `index` of the standard normal stream: Box-Muller on one Philox block per element, so
/// each element is independent of its neighbours and of the chunking.
[[nodiscard]] inline double normal_at(std::uint64_t seed, std::uint64_t index) noexcept {
    const auto r = philox4x32(seed, index);
    const double u1 = 1.0 - unit_double(r[0], r[1]);  // (0, 1]: log stays finite
    const double u2 = unit_double(r[2], r[3]);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace dl::detail
