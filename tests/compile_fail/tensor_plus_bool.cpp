// expect-error: operator\+ needs a Tensor or expression, and a Tensor, expression or number
// bool is not a number operand: `t + true` is more likely a bug than intent.
#include <dl/tensor.hpp>

int main() {
    auto a = dl::zeros<float>({3});
#ifdef DL_CONTROL
    auto e = a + 1;
#else
    auto e = a + true;
#endif
    (void)e;
}
