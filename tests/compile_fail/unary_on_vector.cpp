// expect-error: satisfaction of .expression<E>
// Elementwise functions take a Tensor or an expression; the failed concept is named.
#include <dl/tensor.hpp>

#include <vector>

int main() {
#ifdef DL_CONTROL
    auto e = dl::exp(dl::tensor<float>({1.0f}));
#else
    auto e = dl::exp(std::vector<float>{1.0f});
#endif
    (void)e;
}
