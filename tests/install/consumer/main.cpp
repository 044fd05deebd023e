// Smallest real use of the installed library; built by the install.* ctest tests.
#include <dl/tensor.hpp>

#include <cstdio>

int main() {
  auto x = dl::arange<float>(0, 8);
  dl::Tensor<float> y = x * 2.0f + 1.0f;
  const float got = y(7);
  std::printf("consumer: y(7) = %g (expected 15)\n", static_cast<double>(got));
  // A product: with dl::compiled (COMPONENTS compiled) its kernel is linked from the compiled part.
  const dl::Tensor<float> product = dl::matmul(y.reshape({2, 4}), y.reshape({4, 2}));
  const float corner = product(1, 1);  // 9·3 + 11·7 + 13·11 + 15·15
  std::printf("consumer: (y·y)(1, 1) = %g (expected 472)\n", static_cast<double>(corner));
  return got == 15.0f && corner == 472.0f ? 0 : 1;
}
