// dl::compiled, the opt-in compiled part (CMake target dl::compiled, which defines DL_COMPILED for
// the files that link it): instantiations that every file using them would otherwise compile again,
// compiled once here and declared `extern template` in their headers. Header-only users (dl::dl)
// compile none of this. Build it with the same -march as the files that link it: the header names
// the instruction set in a symbol (DL_COMPILED_FOR) that only a matching build defines.
//
// So far: the float and double GEMM (device/cpu/gemm.hpp). Not yet: the 16-bit and int8 products,
// convolution, the optimisers, and the graph executor, passes and serialisation.
#ifndef DL_COMPILED
#error "src/compiled.cpp is built by the dl::compiled target, which defines DL_COMPILED"
#endif

#include <dl/device/cpu/gemm.hpp>

namespace dl::detail {

void DL_COMPILED_FOR() noexcept {}

template void gemm_checked<float>(const matrix_ref<const float>&, const matrix_ref<const float>&, const matrix_ref<float>&,
                                  const gemm_epilogue<float>&, Context&);
template void gemm_checked<double>(const matrix_ref<const double>&, const matrix_ref<const double>&,
                                   const matrix_ref<double>&, const gemm_epilogue<double>&, Context&);

}  // namespace dl::detail
