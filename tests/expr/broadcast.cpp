// numpy broadcasting of operands against each other: many shape pairs (rank 0, size-1 and size-0
// dimensions, different ranks), checked element by element against an index-based reference; and the
// error for shapes that do not broadcast, which names the op and both shapes.
#include "check.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

using namespace expr_test;

namespace {

/// numpy's rule, written independently of dl::broadcast_shapes.
dl::Shape broadcast_reference(const dl::Shape& a, const dl::Shape& b) {
    const int rank = std::max(a.size(), b.size());
    dl::Shape out;
    for (int i = 0; i < rank; ++i) {
        const int ia = i - (rank - a.size()), ib = i - (rank - b.size());
        const std::int64_t ea = ia >= 0 ? a[ia] : 1, eb = ib >= 0 ? b[ib] : 1;
        out.push_back(ea == 1 ? eb : ea);
    }
    return out;
}

/// Element of `t` at output index `index` of a broadcast result of rank `rank`.
template <class T>
T element_at(const dl::Tensor<T>& t, const std::int64_t* index, int rank) {
    std::int64_t pos = 0;
    for (int d = 0; d < t.rank(); ++d) {
        const std::int64_t i = index[rank - t.rank() + d];
        pos += (t.shape()[d] == 1 ? 0 : i) * t.strides()[d];
    }
    return t.data()[pos];
}

/// Checks f(a, b) against ref(a[..], b[..]) at every index of the broadcast shape.
template <class A, class B, class F, class Ref>
void check_broadcast(const dl::Tensor<A>& a, const dl::Tensor<B>& b, F&& f, Ref&& ref, std::string_view name) {
    const dl::Shape shape = broadcast_reference(a.shape(), b.shape());
    auto y = dl::eval(f(a, b));
    REQUIRE(y.shape() == shape);
    std::vector<double> want;
    std::vector<std::string> inputs;
    dl_test::for_each_index(shape, [&](const std::int64_t* index) {
        const A x = element_at(a, index, shape.size());
        const B z = element_at(b, index, shape.size());
        want.push_back(static_cast<double>(static_cast<typename decltype(y)::value_type>(ref(x, z))));
        inputs.push_back("a=" + show(x) + " b=" + show(z));
    });
    check_elements(y, [&](std::size_t i) { return want[i]; }, exact, name, [&](std::size_t i) { return inputs[i]; });
}

const std::vector<std::pair<dl::Shape, dl::Shape>> broadcastable = {
    {{3, 1}, {1, 4}},       {{2, 3, 4}, {4}},      {{5}, {}},           {{}, {5}},
    {{}, {}},               {{0, 3}, {1, 3}},      {{0, 3}, {3}},       {{0}, {1}},
    {{2, 0, 3}, {2, 1, 1}}, {{1}, {1}},            {{1}, {7}},          {{7}, {1}},
    {{4, 1, 1, 5}, {3, 1}}, {{2, 1, 3}, {4, 1}},   {{1, 1, 1}, {2, 3}}, {{2, 3}, {2, 3}},
    {{8, 1, 17}, {1, 9, 1}}, {{2, 3, 4, 5}, {3, 1, 5}}, {{1, 2, 1, 2, 1, 2}, {2, 1, 2, 1, 2, 1}},
    {{1025}, {1, 1}},       {{33, 1}, {33}},       {{3, 1, 1}, {1, 1, 1025}},
};

}  // namespace

TEST_CASE("binary ops broadcast as numpy does") {
    for (const auto& [sa, sb] : broadcastable) {
        CAPTURE(sa);
        CAPTURE(sb);
        const auto a = random<float>(sa, -10, 10, 1);
        const auto b = random<float>(sb, 1, 10, 2);
        check_broadcast(a, b, [](const auto& x, const auto& y) { return x + y; },
                        [](double x, double y) { return x + y; }, "add");
        check_broadcast(a, b, [](const auto& x, const auto& y) { return x / y; },
                        [](double x, double y) { return x / y; }, "div");
        check_broadcast(b, a, [](const auto& x, const auto& y) { return x - y; },
                        [](double x, double y) { return x - y; }, "sub (swapped)");
        check_broadcast(a, b, [](const auto& x, const auto& y) { return x < y; },
                        [](double x, double y) { return x < y; }, "lt");
        check_broadcast(a, b, EXPR_BINARY(dl::maximum), [](double x, double y) { return std::max(x, y); },
                        "maximum");
    }
}

TEST_CASE("broadcasting works for integer tensors and between different types") {
    for (const auto& [sa, sb] : broadcastable) {
        CAPTURE(sa);
        CAPTURE(sb);
        const auto a = random<std::int32_t>(sa, -100, 100, 3);
        const auto b = random<double>(sb, -1, 1, 4);
        check_broadcast(a, a, [](const auto& x, const auto& y) { return x * y; },
                        [](std::int64_t x, std::int64_t y) { return x * y; }, "mul int");
        check_broadcast(a, b, [](const auto& x, const auto& y) { return x * y; },
                        [](double x, double y) { return x * y; }, "mul int by double");
    }
}

TEST_CASE("a chain of broadcasts: [3,1] * [4] + [2,1,1] - rank 0") {
    const auto a = random<float>({3, 1}, -5, 5, 1);
    const auto b = random<float>({4}, -5, 5, 2);
    const auto c = random<float>({2, 1, 1}, -5, 5, 3);
    const auto s = dl::scalar_tensor<float>(0.5f);
    dl::Tensor<float> y = a * b + c - s;
    REQUIRE(y.shape() == dl::Shape{2, 3, 4});
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 4; ++k) CHECK(y(i, j, k) == a(j, 0) * b(k) + c(i, 0, 0) - 0.5f);
}

TEST_CASE("where and clamp broadcast all their operands") {
    const auto cond = random<bool>({2, 1, 4}, 0, 1, 1);
    const auto a = random<float>({3, 1}, -5, 5, 2);
    const auto b = random<float>({4}, -5, 5, 3);
    dl::Tensor<float> y = dl::where(cond, a, b);
    REQUIRE(y.shape() == dl::Shape{2, 3, 4});
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 4; ++k) CHECK(y(i, j, k) == (cond(i, 0, k) ? a(j, 0) : b(k)));
    dl::Tensor<float> z = dl::clamp(a + b, -1, 1);
    REQUIRE(z.shape() == dl::Shape{3, 4});
    for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) CHECK(z(j, k) == std::clamp(a(j, 0) + b(k), -1.0f, 1.0f));
}

TEST_CASE("broadcasting against an expanded (stride-0) operand") {
    const auto row = random<float>({5}, -1, 1, 1);
    const auto wide = row.expand({4, 5});
    const auto col = random<float>({4, 1}, -1, 1, 2);
    check_broadcast(wide, col, [](const auto& x, const auto& y) { return x * y; },
                    [](double x, double y) { return x * y; }, "mul expanded");
}

TEST_CASE("shapes that do not broadcast throw dl::error naming the op and both shapes") {
    const auto a = dl::zeros<float>({3});
    const auto b = dl::zeros<float>({4});
    const auto m = dl::zeros<float>({2, 3});
    const auto n = dl::zeros<float>({3, 2});
    auto message = [](auto&& f) { return dl_test::error_message(f); };

    std::string e = message([&] { (void)dl::eval(a + b); });
    CHECK(e.find("add") != std::string::npos);
    CHECK(e.find("[3]") != std::string::npos);
    CHECK(e.find("[4]") != std::string::npos);

    e = message([&] { (void)dl::eval(m * n); });
    CHECK(e.find("mul") != std::string::npos);
    CHECK(e.find("[2, 3]") != std::string::npos);
    CHECK(e.find("[3, 2]") != std::string::npos);

    e = message([&] { (void)dl::eval(a == b); });
    CHECK(e.find("eq") != std::string::npos);

    e = message([&] { (void)dl::eval(dl::pow(m, b)); });
    CHECK(e.find("pow") != std::string::npos);
    CHECK(e.find("[2, 3]") != std::string::npos);
    CHECK(e.find("[4]") != std::string::npos);

    e = message([&] { (void)dl::eval(dl::where(b > 0, a, 1.0f)); });
    CHECK(e.find("where") != std::string::npos);

    // The failing pair inside a bigger expression: b - a is the culprit.
    e = message([&] { (void)dl::eval(dl::exp(b - a) * 2); });
    CHECK(e.find("sub") != std::string::npos);

    // [0] does not broadcast with [2] (0 is not 1).
    e = message([&] { (void)dl::eval(dl::zeros<float>({0}) + dl::zeros<float>({2})); });
    CHECK(e.find("[0]") != std::string::npos);
    CHECK(e.find("[2]") != std::string::npos);

    // Reductions over a non-broadcastable expression throw too.
    CHECK_THROWS_AS((void)dl::sum(a + b), dl::error);
}

TEST_CASE("broadcast errors are thrown where the expression is built, not where it is evaluated") {
    const auto m = dl::zeros<float>({3, 4});
    const auto n = dl::zeros<float>({4, 3});
    const std::string e = dl_test::error_message([&] {
        auto lazy = m + n;
        (void)lazy;
    });
    CHECK(e.find("add") != std::string::npos);
    CHECK(e.find("[3, 4]") != std::string::npos);
    CHECK(e.find("[4, 3]") != std::string::npos);
    // Deeper in a chain: the node whose operands disagree throws as it is made.
    CHECK_THROWS_AS((void)(dl::exp(m) * 2 + dl::sqrt(n)), dl::error);
    CHECK_THROWS_AS((void)dl::where(m > 0, n, 1.0f), dl::error);
    // Operands that broadcast build and evaluate as before.
    auto fine = m + dl::zeros<float>({4}) * 2;
    CHECK(fine.eval().shape() == dl::Shape{3, 4});
}
