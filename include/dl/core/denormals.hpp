#pragma once
// Flush-to-zero (FTZ). Values below float's normal range (~1e-38) are computed in microcode on x86,
// ~100x slower; training drives some of them there (Adam's moments of rarely updated weights decay
// towards zero), so dl's compute threads flush results that would be denormal to zero by default
// (context_options::flush_denormals). The cost is ~1e-38 of absolute precision, which no model sees.
// Only FTZ, not DAZ (denormals-are-zero on input): SIMD code that keeps integers in float registers
// (compares and blends on their bit patterns) would read small integers as zero under DAZ; with no
// denormal results, no denormal inputs arise from dl's own arithmetic anyway.
#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#define DL_HAVE_MXCSR 1
#endif

namespace dl {

/// Sets FTZ on this thread for its lifetime when `on`, restoring the previous mode after.
/// A no-op on targets without MXCSR.
class flush_denormals {
public:
    explicit flush_denormals(bool on = true) noexcept {
#ifdef DL_HAVE_MXCSR
        if (on) {
            saved_ = _mm_getcsr();
            _mm_setcsr(saved_ | mask);
            active_ = true;
        }
#else
        (void)on;
#endif
    }
    flush_denormals(const flush_denormals&) = delete;
    flush_denormals& operator=(const flush_denormals&) = delete;
    ~flush_denormals() {
#ifdef DL_HAVE_MXCSR
        if (active_) _mm_setcsr(saved_);
#endif
    }

    /// Whether FTZ is on for this thread now.
    [[nodiscard]] static bool active_on_this_thread() noexcept {
#ifdef DL_HAVE_MXCSR
        return (_mm_getcsr() & mask) == mask;
#else
        return false;
#endif
    }

private:
#ifdef DL_HAVE_MXCSR
    static constexpr unsigned mask = 0x8000u;  // FTZ: MXCSR bit 15
    unsigned saved_ = 0;
    bool active_ = false;
#endif
};

}  // namespace dl
