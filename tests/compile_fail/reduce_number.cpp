// expect-error: dl::max: the argument must be a Tensor or an elementwise expression
// dl::max is a reduction, not std::max.
#include <dl/dl.hpp>

int main() {
    auto m = dl::max(1.0f);
    (void)m;
}
