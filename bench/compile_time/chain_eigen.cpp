// Compile-time baseline (scripts/bench compile_time): chain.cpp's chain written with Eigen's Tensor
// module, the expression-template library dl's compile time is measured against.
#include <unsupported/Eigen/CXX11/Tensor>

using vector = Eigen::Tensor<float, 1>;

vector chain(const vector& x, const vector& y, const vector& z) {
    vector out = (x * 1.5f + y).sigmoid() * z - x.tanh();
    return out;
}

float run() {
    vector x(1024), y(1024), z(1024);
    x.setRandom();
    y.setRandom();
    z.setRandom();
    return chain(x, y, z)(0);
}
