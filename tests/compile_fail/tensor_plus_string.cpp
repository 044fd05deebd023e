// expect-error: operator\+ needs a Tensor or expression
// Adding a Tensor and something that is neither a Tensor, an expression nor a number.
#include <dl/dl.hpp>

#include <string>

int main() {
    auto a = dl::zeros<float>({3});
    auto e = a + std::string("1");
    (void)e;
}
