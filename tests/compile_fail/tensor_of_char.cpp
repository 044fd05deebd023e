// expect-error: satisfaction of .element<T>
// Tensor elements are bool, uint8, int32, int64, float, double (and the 16-bit floats).
#include <dl/tensor.hpp>

int main() {
#ifdef DL_CONTROL
    dl::Tensor<std::uint8_t> t;
#else
    dl::Tensor<char> t;
#endif
    (void)t;
}
