// expect-error: expression is read-only
// The same with a number on the right, through a named expression.
#include <dl/tensor.hpp>

int main() {
    auto a = dl::zeros<float>({3});
    auto e = dl::exp(a);
#ifdef DL_CONTROL
    dl::Tensor<float> t = e;
    t = 1.0f;
#else
    e = 1.0f;
#endif
}
