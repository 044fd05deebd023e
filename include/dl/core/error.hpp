#pragma once
// dl::error: the one exception type of the library. Messages name the op and every value involved,
// so a user can tell what went wrong without a debugger.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dl {

class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

namespace detail {

template <class... Parts>
[[nodiscard]] std::string concat(Parts&&... parts) {
    std::ostringstream out;
    (out << ... << std::forward<Parts>(parts));
    return out.str();
}

template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
    throw error(concat(std::forward<Parts>(parts)...));
}

}  // namespace detail
}  // namespace dl

// Host/device annotation for functors: the same functor runs in a CPU loop and a CUDA kernel.
#if defined(__CUDACC__)
#define DL_HOST_DEVICE __host__ __device__
#else
#define DL_HOST_DEVICE
#endif

// Forces inlining of the small functions a fused loop is made of (functors, evaluators, SIMD math):
// one missed inline there costs a call per element.
#if defined(__GNUC__)
#define DL_INLINE inline __attribute__((always_inline))
#define DL_INLINE_LAMBDA __attribute__((always_inline))
#else
#define DL_INLINE inline
#define DL_INLINE_LAMBDA
#endif
