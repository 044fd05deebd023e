// Smallest real use of the installed library; built by the install.* ctest tests.
#include <dl/tensor.hpp>

#include <cstdio>

int main() {
  auto x = dl::arange<float>(0, 8);
  dl::Tensor<float> y = x * 2.0f + 1.0f;
  const float got = y(7);
  std::printf("consumer: y(7) = %g (expected 15)\n", static_cast<double>(got));
  return got == 15.0f ? 0 : 1;
}
