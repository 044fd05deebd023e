// expect-error: dl::sum: the argument must be a Tensor or an elementwise expression
// Reductions take tensors and expressions, not containers.
#include <dl/tensor.hpp>

#include <vector>

int main() {
#ifdef DL_CONTROL
    auto s = dl::sum(dl::zeros<float>({0}));
#else
    auto s = dl::sum(std::vector<float>{});
#endif
    (void)s;
}
