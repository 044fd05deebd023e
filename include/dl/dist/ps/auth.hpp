#pragma once
// The parameter server's handshake: a server with a shared secret greets each connection with a
// fresh random nonce, and serves it only once the client has answered with HMAC-SHA256(secret,
// "dl::ps hello" + nonce). The secret never crosses the wire, and an answer cannot be replayed on
// another connection. HMAC, SHA-256 and the random bytes are OpenSSL's (libcrypto): well-kept code
// for what must not be subtly wrong.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "../../core/error.hpp"

namespace dl::ps {

inline constexpr std::size_t hello_nonce_bytes = 32, hello_mac_bytes = 32;
using hello_nonce = std::array<std::byte, hello_nonce_bytes>;
using hello_mac = std::array<std::byte, hello_mac_bytes>;

/// HMAC-SHA256 (RFC 2104 over FIPS 180-4's SHA-256) of data under key.
[[nodiscard]] inline std::array<std::byte, 32> hmac_sha256(std::string_view key, std::span<const std::byte> data) {
    std::array<std::byte, 32> mac{};
    unsigned int length = 0;
    if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()), data.size(),
             reinterpret_cast<unsigned char*>(mac.data()), &length) == nullptr ||
        length != mac.size())
        dl::detail::fail("dl::ps: OpenSSL could not compute an HMAC-SHA256");
    return mac;
}

/// A nonce from OpenSSL's CSPRNG.
[[nodiscard]] inline hello_nonce random_nonce() {
    hello_nonce n{};
    if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1)
        dl::detail::fail("dl::ps: OpenSSL could not produce random bytes for a handshake nonce");
    return n;
}

/// What a client answers a server's nonce with.
[[nodiscard]] inline hello_mac answer_hello(std::string_view secret, const hello_nonce& nonce) {
    constexpr std::string_view context = "dl::ps hello";
    std::vector<std::byte> data(context.size() + nonce.size());
    std::memcpy(data.data(), context.data(), context.size());
    std::memcpy(data.data() + context.size(), nonce.data(), nonce.size());
    return hmac_sha256(secret, data);
}

/// Whether an answer is right, compared in constant time (CRYPTO_memcmp): how long a check takes says
/// nothing of how much of a guess was right.
[[nodiscard]] inline bool hello_answer_matches(std::string_view secret, const hello_nonce& nonce, const hello_mac& answer) {
    const hello_mac expected = answer_hello(secret, nonce);
    return CRYPTO_memcmp(expected.data(), answer.data(), expected.size()) == 0;
}

}  // namespace dl::ps
