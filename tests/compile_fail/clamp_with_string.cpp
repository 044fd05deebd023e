// expect-error: satisfaction of .scalar<H>
// clamp's bounds are numbers.
#include <dl/tensor.hpp>

#include <string>

int main() {
    auto a = dl::zeros<float>({3});
#ifdef DL_CONTROL
    auto e = dl::clamp(a, 0, 1);
#else
    auto e = dl::clamp(a, 0, std::string("1"));
#endif
    (void)e;
}
