// expect-error: dl::max: the argument must be a Tensor or an elementwise expression
// dl::max is a reduction, not std::max.
#include <dl/tensor.hpp>

int main() {
#ifdef DL_CONTROL
    auto m = dl::max(dl::full<float>({1}, 1.0f));
#else
    auto m = dl::max(1.0f);
#endif
    (void)m;
}
