// expect-error: satisfaction of .element<U>
// cast<U> converts to an element type only.
#include <dl/tensor.hpp>

#include <string>

int main() {
    auto a = dl::zeros<float>({3});
#ifdef DL_CONTROL
    auto e = dl::cast<double>(a);
#else
    auto e = dl::cast<std::string>(a);
#endif
    (void)e;
}
