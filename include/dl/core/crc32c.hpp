#pragma once
// CRC32C (Castagnoli), for the checksums of dl's file formats: record files (data/), checkpoints and
// graph files (nn/, graph/), the parameter server's logs. It sits in core/ so that each of those
// layers reaches it.
//
// Hand-written (no Debian package ships a C++ CRC32C library): the SSE4.2 crc32 instruction where the
// target has it, a table otherwise, both checked against RFC 3720's vectors.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace dl {

namespace detail {

inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
        t[i] = c;
    }
    return t;
}();

/// CRC32C of `bytes` continuing from `crc` (0 to start), with a table: the reference path.
[[nodiscard]] inline std::uint32_t crc32c_table_path(const void* bytes, std::size_t n, std::uint32_t crc = 0) noexcept {
    const auto* p = static_cast<const unsigned char*>(bytes);
    crc = ~crc;
    for (std::size_t i = 0; i < n; ++i) crc = crc32c_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

}  // namespace detail

/// CRC32C (Castagnoli) of `bytes`, continuing from `crc`.
[[nodiscard]] inline std::uint32_t crc32c(const void* bytes, std::size_t n, std::uint32_t crc = 0) noexcept {
#if defined(__SSE4_2__)
    const auto* p = static_cast<const unsigned char*>(bytes);
    std::uint64_t c = ~crc;
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        std::uint64_t word;
        std::memcpy(&word, p + i, 8);
        c = _mm_crc32_u64(c, word);
    }
    auto c32 = static_cast<std::uint32_t>(c);
    for (; i < n; ++i) c32 = _mm_crc32_u8(c32, p[i]);
    return ~c32;
#else
    return detail::crc32c_table_path(bytes, n, crc);
#endif
}

}  // namespace dl
