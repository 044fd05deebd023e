// expect-error: only a Tensor, an expression or a number can be assigned to a Tensor
// copy_from (and assign) take tensors, expressions and numbers.
#include <dl/tensor.hpp>

#include <string>

int main() {
    auto a = dl::zeros<float>({3});
#ifdef DL_CONTROL
    a.copy_from(1.0f);
#else
    a.copy_from(std::string("1"));
#endif
}
