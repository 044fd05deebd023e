// expect-error: operator- needs a Tensor or expression
// The same misuse with the tensor on the right.
#include <dl/tensor.hpp>

#include <string>

int main() {
    auto a = dl::zeros<float>({3});
#ifdef DL_CONTROL
    auto e = 1 - a;
#else
    auto e = std::string("1") - a;
#endif
    (void)e;
}
