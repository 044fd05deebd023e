// expect-error: operator< needs a Tensor or expression
// Comparing an expression with a pointer.
#include <dl/tensor.hpp>

int main() {
    auto a = dl::zeros<float>({3});
    const float* p = a.data();
#ifdef DL_CONTROL
    auto e = (a * 2) < *p;
#else
    auto e = (a * 2) < p;
#endif
    (void)e;
}
