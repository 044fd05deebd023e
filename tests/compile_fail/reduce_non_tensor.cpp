// expect-error: dl::sum: the argument must be a Tensor or an elementwise expression
// Reductions take tensors and expressions, not containers.
#include <dl/dl.hpp>

#include <vector>

int main() {
    auto s = dl::sum(std::vector<float>{});
    (void)s;
}
