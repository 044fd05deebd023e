// Compile-time benchmark (scripts/bench times `g++ -O2 -march=native -c` of this file): the
// benchmark chain evaluated into a tensor, as a user's translation unit would do it.
#include <dl/dl.hpp>

dl::Tensor<float> chain(const dl::Tensor<float>& x, const dl::Tensor<float>& y, const dl::Tensor<float>& z) {
    dl::Tensor<float> out = dl::sigmoid(x * 1.5f + y) * z - dl::tanh(x);
    return out;
}

float run() {
    dl::Context ctx;
    auto x = dl::uniform<float>({1024}, -1, 1, ctx);
    auto y = dl::uniform<float>({1024}, -1, 1, ctx);
    auto z = dl::uniform<float>({1024}, -1, 1, ctx);
    return chain(x, y, z)(0);
}
