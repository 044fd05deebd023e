// expect-error: satisfaction of .binary_operands<A, B>
// Named binary functions take tensors, expressions and numbers, like the operators.
#include <dl/tensor.hpp>

#include <string>

int main() {
    auto a = dl::zeros<float>({3});
#ifdef DL_CONTROL
    auto e = dl::pow(a, 2);
#else
    auto e = dl::pow(a, std::string("2"));
#endif
    (void)e;
}
