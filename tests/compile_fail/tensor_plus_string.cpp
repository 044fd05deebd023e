// expect-error: operator\+ needs a Tensor or expression
// Adding a Tensor and something that is neither a Tensor, an expression nor a number.
#include <dl/tensor.hpp>

#include <string>

int main() {
    auto a = dl::zeros<float>({3});
#ifdef DL_CONTROL
    auto e = a + 1.0f;
#else
    auto e = a + std::string("1");
#endif
    (void)e;
}
