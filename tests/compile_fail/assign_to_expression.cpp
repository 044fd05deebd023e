// expect-error: expression is read-only
// Expressions are values, not places: assign to a Tensor or a view of one.
#include <dl/tensor.hpp>

int main() {
    auto a = dl::zeros<float>({3});
    auto b = dl::zeros<float>({3});
    auto c = dl::zeros<float>({3});
#ifdef DL_CONTROL
    c = a + b;
#else
    (a + b) = c;
#endif
}
