#pragma once
// The activations a product (a GEMM, a convolution) can apply to its output tile in its epilogue, on
// every device. Its own header so that what names an epilogue (op records, the graph IR) does not pull
// in the kernels.
#include <cstdint>

namespace dl {

enum class activation : std::uint8_t { none, relu, gelu, sigmoid, tanh };

}  // namespace dl
