// Writing expressions into tensors: aliasing between the destination and the operands, compound
// assignment, views as destinations, shape errors, null destinations, eval, and expressions kept in
// `auto` and evaluated later.
#include "check.hpp"

#include <cstdint>
#include <string>
#include <vector>

using namespace expr_test;

namespace {
bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }
}  // namespace

// --- aliasing ---

TEST_CASE("a = a * 2 + a.transpose(0, 1) reads the old a everywhere") {
    for (const std::int64_t n : {1, 5, 64, 700}) {  // 700^2: the threaded loop
        CAPTURE(n);
        auto a = random<float>({n, n}, -10, 10, 1);
        const auto old = a.clone();
        a = a * 2 + a.transpose(0, 1);
        for (std::int64_t i = 0; i < n; i += (n > 64 ? 13 : 1))
            for (std::int64_t j = 0; j < n; j += (n > 64 ? 7 : 1)) REQUIRE(a(i, j) == old(i, j) * 2 + old(j, i));
        dl::Tensor<float> want = old * 2 + old.t();
        CHECK(bitwise_equal(a, want));
    }
}

TEST_CASE("in-place a = f(a), elementwise, at every size") {
    for (const std::int64_t n : sizes) {
        CAPTURE(n);
        auto a = random<float>({n}, -5, 5, 2);
        const auto old = a.clone();
        const float* storage = a.data();
        a = a * 2;
        CHECK(a.data() == storage);  // written in place, not rebound
        check_elements(a, [&](std::size_t i) { return old.data()[i] * 2.0; }, exact, "a = a * 2",
                       [](std::size_t) { return std::string(); });
        a = dl::exp(a * 0.1f) - a;
        dl::Tensor<float> want = dl::exp(old * 2 * 0.1f) - old * 2;
        CHECK(bitwise_equal(a, want));
    }
}

TEST_CASE("outputs larger than the last-level cache (streaming stores) get the bits of small pieces, 1 and 2 threads") {
    const std::int64_t n = dl::detail::last_level_cache_bytes() / 4 + 17;  // and an odd tail
    for (const int threads : {1, 2}) {
        CAPTURE(threads);
        dl::Context ctx({.seed = 5, .threads = threads});
        auto x = random<float>({n}, -4, 4, 6, 0, ctx), y = random<float>({n}, -4, 4, 7, 0, ctx);
        REQUIRE(dl::detail::streams(x.data(), n));
        dl::Tensor<float> out = dl::sigmoid(x * 1.5f + y) * y - dl::tanh(x);
        auto pieces = dl::Tensor<float>(dl::Shape{n}, ctx);
        const std::int64_t piece = std::int64_t{1} << 18;  // 1 MiB: cached, plain stores
        for (std::int64_t at = 0; at < n; at += piece) {
            const std::int64_t stop = std::min(n, at + piece);
            auto xs = x.slice(0, at, stop), ys = y.slice(0, at, stop);
            pieces.slice(0, at, stop) = dl::sigmoid(xs * 1.5f + ys) * ys - dl::tanh(xs);
        }
        CHECK(bitwise_equal(out, pieces));
        // In place: each streaming store writes the element just read.
        const auto old = x.clone();
        const float* storage = x.data();
        x = dl::exp(x * 0.5f) - y;
        CHECK(x.data() == storage);
        for (std::int64_t at = 0; at < n; at += piece) {
            const std::int64_t stop = std::min(n, at + piece);
            pieces.slice(0, at, stop) = dl::exp(old.slice(0, at, stop) * 0.5f) - y.slice(0, at, stop);
        }
        CHECK(bitwise_equal(x, pieces));
    }
}

TEST_CASE("in-place on a large tensor (threads)") {
    const std::int64_t n = 3'000'001;
    auto a = random<float>({n}, -1, 1, 3);
    const auto old = a.clone();
    a = a * 3.0f + 1.0f;
    dl::Tensor<float> want = old * 3.0f + 1.0f;
    CHECK(bitwise_equal(a, want));
}

TEST_CASE("writing into a slice from an overlapping slice of the same tensor") {
    for (const std::int64_t n : {8, 1025, 300'000}) {
        CAPTURE(n);
        SUBCASE("shift right: x[1:] = x[:-1] + 1") {
            auto x = random<float>({n}, -5, 5, 4);
            const auto old = x.clone();
            x.slice(0, 1, n) = x.slice(0, 0, n - 1) + 1.0f;
            CHECK(x(0) == old(0));
            check_elements(
                x.slice(0, 1, n), [&](std::size_t i) { return static_cast<double>(old.data()[i] + 1.0f); }, exact,
                "x[1:] = x[:-1] + 1", [](std::size_t i) { return "i=" + std::to_string(i); });
        }
        SUBCASE("shift left: x[:-1] = x[1:] * 2") {
            auto x = random<float>({n}, -5, 5, 5);
            const auto old = x.clone();
            x.slice(0, 0, n - 1) = x.slice(0, 1, n) * 2.0f;
            CHECK(x(n - 1) == old(n - 1));
            check_elements(x.slice(0, 0, n - 1), [&](std::size_t i) { return old.data()[i + 1] * 2.0; }, exact,
                           "x[:-1] = x[1:] * 2", [](std::size_t i) { return "i=" + std::to_string(i); });
        }
        SUBCASE("element copy between overlapping views: x[2:] = x[:-2]") {
            auto x = random<float>({n}, -5, 5, 6);
            const auto old = x.clone();
            x.slice(0, 2, n) = x.slice(0, 0, n - 2);
            check_elements(x.slice(0, 2, n), [&](std::size_t i) { return static_cast<double>(old.data()[i]); }, exact,
                           "x[2:] = x[:-2]", [](std::size_t i) { return "i=" + std::to_string(i); });
        }
    }
}

TEST_CASE("aliasing through broadcasts and transposes") {
    SUBCASE("m = m - m[0:1]: every row reads the old first row") {
        auto m = random<float>({50, 33}, -5, 5, 7);
        const auto old = m.clone();
        m = m - m.slice(0, 0, 1);
        for (int i = 0; i < 50; ++i)
            for (int j = 0; j < 33; ++j) REQUIRE(m(i, j) == old(i, j) - old(0, j));
    }
    SUBCASE("m[:, 1:] = m[:, :-1] * m[:, 0:1]") {
        auto m = random<double>({20, 40}, -2, 2, 8);
        const auto old = m.clone();
        m.slice(1, 1, 40) = m.slice(1, 0, 39) * m.slice(1, 0, 1);
        for (int i = 0; i < 20; ++i) {
            CHECK(m(i, 0) == old(i, 0));
            for (int j = 1; j < 40; ++j) REQUIRE(m(i, j) == old(i, j - 1) * old(i, 0));
        }
    }
    SUBCASE("in-place transpose of a square matrix through a view: m[:] = m.t()") {
        auto m = random<float>({129, 129}, -5, 5, 9);
        const auto old = m.clone();
        m.slice(0, 0, 129) = m.t();
        CHECK(bitwise_equal(m, old.t().clone()));
    }
    SUBCASE("a cast chain over a transposed alias") {
        auto m = random<float>({64, 64}, -5, 5, 10);
        const auto old = m.clone();
        m = dl::cast<float>(dl::cast<double>(m.t()) * 2.0);
        CHECK(bitwise_equal(m, dl::Tensor<float>(old.t() * 2.0f)));
    }
    SUBCASE("a reversed-order alias via a stepped slice: x[::2] = x[1::2] + x[::2]") {
        auto x = random<std::int32_t>({1001}, -100, 100, 11);
        const auto old = x.clone();
        x.slice(0, 0, 1000, 2) = x.slice(0, 1, 1001, 2) + x.slice(0, 0, 1000, 2);
        for (int i = 0; i < 500; ++i) REQUIRE(x(2 * i) == old(2 * i + 1) + old(2 * i));
        for (int i = 0; i < 500; ++i) REQUIRE(x(2 * i + 1) == old(2 * i + 1));
    }
}

// --- compound assignment ---

TEST_CASE_TEMPLATE("compound assignment with tensors, numbers and expressions", T, float, double, std::int32_t) {
    const auto b = random<T>({3, 4}, 1, 9, 2);
    auto a = random<T>({3, 4}, -9, 9, 1);
    auto want = to_vector(a);
    const auto vb = to_vector(b);
    auto expect = [&](auto op) {
        for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<T>(op(want[i], vb[i]));
    };
    a += b;
    expect([](T x, T y) { return x + y; });
    CHECK(to_vector(a) == want);
    a -= b * 2;
    expect([](T x, T y) { return x - y * 2; });
    CHECK(to_vector(a) == want);
    a *= b;
    expect([](T x, T y) { return x * y; });
    CHECK(to_vector(a) == want);
    a /= b;
    expect([](T x, T y) { return x / y; });
    CHECK(to_vector(a) == want);
    a += 3;
    expect([](T x, T) { return x + 3; });
    CHECK(to_vector(a) == want);
    a *= -2;
    expect([](T x, T) { return x * -2; });
    CHECK(to_vector(a) == want);
    a /= 4;
    expect([](T x, T) { return x / 4; });
    CHECK(to_vector(a) == want);
    const void* before = a.data();
    (a += b) *= 2;  // returns the tensor itself
    expect([](T x, T y) { return (x + y) * 2; });
    CHECK(to_vector(a) == want);
    CHECK(static_cast<const void*>(a.data()) == before);
}

TEST_CASE("compound assignment broadcasts the right side and writes through views") {
    auto m = dl::zeros<float>({3, 4});
    m += dl::tensor<float>({1, 2, 3, 4});  // row broadcast
    m *= dl::tensor<float>({1, 10, 100}).reshape({3, 1});  // column broadcast
    CHECK(to_vector(m) == std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40, 100, 200, 300, 400});
    m.slice(1, 0, 4, 2) -= 1.0f;  // every other column, through an rvalue view
    CHECK(to_vector(m) == std::vector<float>{0, 2, 2, 4, 9, 20, 29, 40, 99, 200, 299, 400});
    m.t() /= dl::scalar_tensor<float>(2.0f);
    CHECK(to_vector(m) == std::vector<float>{0, 1, 1, 2, 4.5, 10, 14.5, 20, 49.5, 100, 149.5, 200});
    auto col = m.select(1, 1);  // a named view
    col += 1000.0f;
    CHECK(to_vector(m.select(1, 1)) == std::vector<float>{1001, 1010, 1100});
}

TEST_CASE("compound assignment with the tensor itself, transposed, on the right") {
    auto m = random<float>({65, 65}, -5, 5, 3);
    const auto old = m.clone();
    m += m.t();
    dl::Tensor<float> want = old + old.t();
    CHECK(bitwise_equal(m, want));
    m -= m.slice(0, 0, 1);
    for (int j = 0; j < 65; ++j) CHECK(m(0, j) == 0.0f);
    for (int i = 1; i < 65; i += 9)
        for (int j = 0; j < 65; j += 11) CHECK(m(i, j) == want(i, j) - want(0, j));
}

TEST_CASE("integer compound division by zero gives 0") {
    auto a = dl::tensor<std::int32_t>({7, -7, 9});
    a /= dl::tensor<std::int32_t>({2, 0, -3});
    CHECK(to_vector(a) == std::vector<std::int32_t>{3, 0, -3});
    a /= 0;
    CHECK(to_vector(a) == std::vector<std::int32_t>{0, 0, 0});
}

TEST_CASE("compound assignment whose right side would grow the tensor throws and leaves it unchanged") {
    auto row = dl::tensor<float>({1, 2, 3});
    const std::string e = dl_test::error_message([&] { row += dl::zeros<float>({2, 3}); });
    CHECK(contains(e, "[2, 3]"));
    CHECK(contains(e, "[3]"));
    CHECK(to_vector(row) == std::vector<float>{1, 2, 3});
    CHECK_THROWS_AS(row *= dl::zeros<float>({4}), dl::error);
    CHECK(to_vector(row) == std::vector<float>{1, 2, 3});
}

// --- destinations ---

TEST_CASE("assigning into a slice of a bigger tensor writes only the slice") {
    auto big = dl::zeros<float>({6, 5});
    const auto small = random<float>({3, 5}, -1, 1, 4);
    big.slice(0, 2, 5) = small + 1.0f;
    for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 5; ++j) CHECK(big(i, j) == (i >= 2 && i < 5 ? small(i - 2, j) + 1.0f : 0.0f));
    big.slice(1, 1, 3) = 7.0f;  // a number fills
    for (int i = 0; i < 6; ++i) CHECK((big(i, 1) == 7.0f && big(i, 2) == 7.0f && big(i, 0) != 7.0f));
    big.slice(0, 0, 2) = dl::tensor<float>({9, 8, 7, 6, 5});  // a tensor broadcast into a view: element copy
    CHECK(to_vector(big.slice(0, 0, 2)) == std::vector<float>{9, 8, 7, 6, 5, 9, 8, 7, 6, 5});
    auto ints = dl::zeros<std::int64_t>({4});
    ints.slice(0, 1, 3) = 5;
    CHECK(to_vector(ints) == std::vector<std::int64_t>{0, 5, 5, 0});
}

TEST_CASE("a smaller expression broadcasts into a bigger destination") {
    auto m = dl::zeros<double>({2, 3});
    m = dl::tensor<double>({1, 2, 3}) * 2.0;
    CHECK(to_vector(m) == std::vector<double>{2, 4, 6, 2, 4, 6});
    m = dl::scalar_tensor<double>(5.0) + 0.0;
    CHECK(to_vector(m) == std::vector<double>(6, 5.0));
}

TEST_CASE("assigning an expression of a non-broadcastable shape throws naming both shapes") {
    auto t = dl::zeros<float>({3});
    std::string e = dl_test::error_message([&] { t = dl::zeros<float>({4}) + 1.0f; });
    CHECK(contains(e, "[4]"));
    CHECK(contains(e, "[3]"));
    // Broadcastable with t, but bigger than t: t cannot grow.
    e = dl_test::error_message([&] { t = dl::zeros<float>({2, 3}) * 2.0f; });
    CHECK(contains(e, "[2, 3]"));
    CHECK(contains(e, "[3]"));
    auto m = dl::zeros<float>({2, 3});
    e = dl_test::error_message([&] { m.slice(1, 0, 2) = dl::zeros<float>({3}) - 1.0f; });
    CHECK(contains(e, "[2, 2]"));
    CHECK(contains(e, "[3]"));
    CHECK(dl::sum(dl::abs(m)).item() == 0.0f);  // nothing written
}

TEST_CASE("assigning into a null tensor allocates it with the expression's shape and context") {
    dl::Context ctx({.seed = 0, .threads = 1});
    const auto a = random<float>({2, 3}, -1, 1, 1, 0, ctx);
    dl::Tensor<float> t;
    CHECK_FALSE(t.defined());
    t = a * 2.0f + 1.0f;
    REQUIRE(t.defined());
    CHECK(t.shape() == dl::Shape{2, 3});
    CHECK(&t.context() == &ctx);
    CHECK(same_values(t, dl::Tensor<float>(a * 2.0f + 1.0f)));
    dl::Tensor<double> u;
    u = 1.0 - a;  // number first: the context still comes from the tensor
    CHECK(&u.context() == &ctx);
    CHECK(u.shape() == dl::Shape{2, 3});
    dl::Tensor<float> v = a + 0.0f;  // construction from an expression
    CHECK(&v.context() == &ctx);
    CHECK_FALSE(v.shares_storage(a));
}

// Was a crash (a write through data() == nullptr); run in a child so a regression fails one check.
TEST_CASE("assigning a number to a null tensor does not crash") {
    const int code = dl_test::exit_code_in_child([] {
        dl::Tensor<float> t;
        try {
            t = 1.0f;
        } catch (const dl::error&) {
            return 0;  // refusing is fine
        }
        return t.defined() && t.numel() == 1 && t.item() == 1.0f ? 0 : 1;  // so is a rank-0 tensor
    });
    CHECK(code == 0);
}

// --- eval and deferred evaluation ---

TEST_CASE("eval and .eval() produce new tensors; dl::eval of a tensor returns it") {
    auto a = dl::tensor<float>({1, 2, 3});
    const auto b = dl::tensor<float>({10, 20, 30});
    auto e1 = (a + b).eval();
    auto e2 = dl::eval(a * b);
    static_assert(std::is_same_v<decltype(e1), dl::Tensor<float>>);
    static_assert(std::is_same_v<decltype(dl::eval(a == b)), dl::Tensor<bool>>);
    a = 0.0f;  // later changes to the inputs do not reach evaluated results
    CHECK(to_vector(e1) == std::vector<float>{11, 22, 33});
    CHECK(to_vector(e2) == std::vector<float>{10, 40, 90});
    CHECK(dl::eval(a).shares_storage(a));
}

TEST_CASE("auto e = a + b * 2 holds named tensors by reference and is evaluated when assigned") {
    auto a = dl::tensor<float>({1, 2, 3});
    auto b = dl::tensor<float>({1, 1, 1});
    auto e = a + b * 2;
    a = 10.0f;  // element writes before evaluation are seen
    b.slice(0, 1, 2) = 5.0f;
    CHECK(to_vector(e.eval()) == std::vector<float>{12, 20, 12});
    auto twice = e * e;  // a named expression inside another is held by reference too
    a = 0.0f;
    CHECK(to_vector(dl::eval(twice)) == std::vector<float>{4, 100, 4});
    dl::Tensor<float> out = dl::zeros<float>({3});
    out = e;
    CHECK(to_vector(out) == std::vector<float>{2, 10, 2});
}

TEST_CASE("expressions built from temporaries own them and stay valid") {
    auto make = [] {
        auto a = dl::arange<float>(5);
        return a.slice(0, 0, 2) + 1.0f;  // the slice (a temporary view) moves into the expression
    };
    auto e = make();  // `a` is gone; its storage lives on in the view
    CHECK(to_vector(e.eval()) == std::vector<float>{1, 2});

    auto a = dl::arange<float>(4);
    auto chain = dl::exp(a.slice(0, 0, 4) * 0.0f) + (a + 1.0f) * (a - 1.0f);  // temporaries at every level
    CHECK(to_vector(dl::eval(chain)) == std::vector<float>{0, 1, 4, 9});
    auto s = dl::sum(dl::tensor<float>({1, 2}) * dl::tensor<float>({3, 4}));
    CHECK(s.item() == 11.0f);
}

TEST_CASE("fill and number assignment") {
    auto t = dl::empty<std::int32_t>({2, 3});
    t = 4;
    CHECK(to_vector(t) == std::vector<std::int32_t>(6, 4));
    t.fill(-1);
    CHECK(to_vector(t) == std::vector<std::int32_t>(6, -1));
    auto f = dl::empty<float>({1025});
    f = 2.5;
    CHECK(to_vector(f) == std::vector<float>(1025, 2.5f));
    auto bools = dl::empty<bool>({3});
    bools = true;
    CHECK(to_vector(bools) == std::vector<bool>{true, true, true});
}

// --- accumulate: assign(out, e, true) adds e into out in the loop that would write e ---

TEST_CASE_TEMPLATE("assign with accumulate adds into out: SIMD, broadcast, strided and odd tails, threads", T, float,
                   double, dl::bfloat16) {
    dl::Context two({.threads = 2});
    for (const std::int64_t n : {1, 7, 17, 1025, 300000}) {
        CAPTURE(n);
        const auto a = random<T>({2, n}, -4, 4, 3, 0.25, two);
        const auto row = random<T>({1, n}, -4, 4, 4, 0.25, two);   // broadcast over rows (stride 0)
        const auto col = random<T>({2, 1}, -4, 4, 5, 0.25, two);   // broadcast along each row
        auto out = random<T>({2, n}, -4, 4, 6, 0.25, two);
        const auto before = out.clone();
        dl::assign(out, a * row + col, true);
        // The reference: the float (compute-type) sum rounded once, as out + e would give.
        dl::Tensor<T> want = before + (a * row + col);
        CHECK(bitwise_equal(out, want));
        // A strided destination takes the scalar loop (exact ops: the scalar and SIMD exp of double may
        // differ in the last bit).
        auto wide = spread(before);
        dl::assign(wide, a * 0.5f - dl::abs(row), true);
        want = before + (a * 0.5f - dl::abs(row));
        CHECK(bitwise_equal(wide.contiguous(), want));
    }
}

TEST_CASE("assign with accumulate: numbers, integers (SIMD and scalar loops); null and bool tensors are refused") {
    auto t = from_values<float>({1, 2, 3});
    dl::assign(t, 0.5f, true);
    CHECK(to_vector(t) == std::vector<float>{1.5f, 2.5f, 3.5f});
    const auto a = random<std::int32_t>({1031}, -100, 100, 8);
    auto sum = random<std::int32_t>({1031}, -100, 100, 9);
    const auto before = sum.clone();
    dl::assign(sum, a * 3, true);
    auto strided = spread(before);
    dl::assign(strided, a * 3, true);
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        REQUIRE(sum(i) == before(i) + 3 * a(i));
        REQUIRE(strided(i) == before(i) + 3 * a(i));
    }
    dl::Tensor<bool> flags = dl::zeros<bool>({3});
    CHECK_THROWS_WITH_AS(dl::assign(flags, t > 2.0f, true), doctest::Contains("cannot add into a bool tensor"), dl::error);
    dl::Tensor<float> null;
    CHECK_THROWS_WITH_AS(dl::assign(null, t * 2, true), doctest::Contains("cannot add into a null tensor"), dl::error);
    CHECK_FALSE(null.defined());
}
