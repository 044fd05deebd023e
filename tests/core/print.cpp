// operator<< for tensors: header line, nested brackets, aligned columns, summarised large tensors.
#include "support.hpp"

using dl::Tensor;
using dl_test::to_string;

TEST_CASE("a small float matrix prints in full with aligned columns") {
    CHECK(to_string(dl::tensor<float>({{1, 2, 3}, {4, 5, 6}})) ==
          "tensor(float32, shape=[2, 3])\n"
          "[[1, 2, 3],\n"
          " [4, 5, 6]]");
    CHECK(to_string(dl::tensor<float>({{1.5f, -2, 3}, {4, 5, 6}})) ==
          "tensor(float32, shape=[2, 3])\n"
          "[[1.5,  -2,   3],\n"
          " [  4,   5,   6]]");
    CHECK(to_string(dl::tensor<double>({0.25, -1e-7, 1e6})) ==
          "tensor(float64, shape=[3])\n"
          "[  0.25, -1e-07,  1e+06]");
}

TEST_CASE("integer tensors print as numbers, uint8 included") {
    CHECK(to_string(dl::tensor<std::int32_t>({{1, -20}, {300, 4}})) ==
          "tensor(int32, shape=[2, 2])\n"
          "[[  1, -20],\n"
          " [300,   4]]");
    CHECK(to_string(dl::tensor<std::int64_t>({std::int64_t{1} << 40, -1})) ==
          "tensor(int64, shape=[2])\n"
          "[1099511627776,            -1]");
    CHECK(to_string(dl::tensor<std::uint8_t>({{0, 7, 255}})) ==
          "tensor(uint8, shape=[1, 3])\n"
          "[[  0,   7, 255]]");
}

TEST_CASE("bool tensors print true and false") {
    CHECK(to_string(dl::tensor<bool>({true, false, true})) ==
          "tensor(bool, shape=[3])\n"
          "[ true, false,  true]");
    CHECK(to_string(dl::tensor<bool>({true, true})) ==
          "tensor(bool, shape=[2])\n"
          "[true, true]");
}

TEST_CASE("non-finite and inexact floats print as the C++ stream does, at 6 significant digits") {
    CHECK(to_string(dl::tensor<float>({NAN, INFINITY, -INFINITY, 1.0f / 3})) ==
          "tensor(float32, shape=[4])\n"
          "[     nan,      inf,     -inf, 0.333333]");
    CHECK(to_string(dl::tensor<double>({0.1, 123456789.0})) ==
          "tensor(float64, shape=[2])\n"
          "[        0.1, 1.23457e+08]");
}

TEST_CASE("rank 0, empty and null tensors") {
    CHECK(to_string(dl::scalar_tensor<float>(3.5f)) == "tensor(float32, shape=[])\n3.5");
    CHECK(to_string(dl::zeros<float>({0})) == "tensor(float32, shape=[0])\n[]");
    CHECK(to_string(dl::zeros<std::int32_t>({2, 0})) == "tensor(int32, shape=[2, 0])\n[[],\n []]");
    CHECK(to_string(Tensor<float>{}) == "tensor(float32, shape=[]) null");
    CHECK(to_string(Tensor<bool>{}) == "tensor(bool, shape=[]) null");
}

TEST_CASE("rank 3 separates blocks with a blank line") {
    CHECK(to_string(dl::tensor<float>({{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}})) ==
          "tensor(float32, shape=[2, 2, 2])\n"
          "[[[1, 2],\n"
          "  [3, 4]],\n"
          "\n"
          " [[5, 6],\n"
          "  [7, 8]]]");
}

TEST_CASE("views print their logical elements") {
    const auto m = dl::tensor<std::int32_t>({{1, 2, 3}, {4, 5, 6}});
    CHECK(to_string(m.t()) ==
          "tensor(int32, shape=[3, 2])\n"
          "[[1, 4],\n"
          " [2, 5],\n"
          " [3, 6]]");
    CHECK(to_string(m.select(1, 2)) == "tensor(int32, shape=[2])\n[3, 6]");
    CHECK(to_string(m.slice(1, 0, 3, 2).expand({2, 2, 2})) ==
          "tensor(int32, shape=[2, 2, 2])\n"
          "[[[1, 3],\n"
          "  [4, 6]],\n"
          "\n"
          " [[1, 3],\n"
          "  [4, 6]]]");
}

TEST_CASE("1000 elements print in full; more are summarised with ...") {
    const auto thousand = dl::arange<std::int32_t>(1000);
    const std::string full = to_string(thousand);
    CHECK(full.find("...") == std::string::npos);
    CHECK(full.find("500") != std::string::npos);

    const std::string line = to_string(dl::arange<std::int32_t>(2000));
    CHECK(line == "tensor(int32, shape=[2000])\n[   0,    1,    2, ..., 1997, 1998, 1999]");

    const std::string rows = to_string(dl::arange<std::int32_t>(2000).reshape({20, 100}));
    CHECK(rows ==
          "tensor(int32, shape=[20, 100])\n"
          "[[   0,    1,    2, ...,   97,   98,   99],\n"
          " [ 100,  101,  102, ...,  197,  198,  199],\n"
          " [ 200,  201,  202, ...,  297,  298,  299],\n"
          " ...,\n"
          " [1700, 1701, 1702, ..., 1797, 1798, 1799],\n"
          " [1800, 1801, 1802, ..., 1897, 1898, 1899],\n"
          " [1900, 1901, 1902, ..., 1997, 1998, 1999]]");
}

TEST_CASE("a summarised tensor keeps short dimensions whole and sizes columns from shown values only") {
    // [500, 3]: the long dimension is cut, the short one is not; the hidden 99999 does not widen columns.
    auto t = dl::zeros<std::int64_t>({500, 3});
    t(250, 1) = 99999;
    t(0, 0) = 1;
    t(499, 2) = 2;
    const std::string s = to_string(t);
    CHECK(s ==
          "tensor(int64, shape=[500, 3])\n"
          "[[1, 0, 0],\n"
          " [0, 0, 0],\n"
          " [0, 0, 0],\n"
          " ...,\n"
          " [0, 0, 0],\n"
          " [0, 0, 0],\n"
          " [0, 0, 2]]");
}

TEST_CASE("printing a large random tensor does not print every element") {
    dl::Context ctx({.seed = 1, .threads = 1});
    const auto big = dl::uniform<float>({300, 400}, 0, 1, ctx);
    const std::string s = to_string(big);
    CHECK(s.rfind("tensor(float32, shape=[300, 400])\n[[", 0) == 0);
    CHECK(s.find("...") != std::string::npos);
    CHECK(s.size() < 2000);
}
