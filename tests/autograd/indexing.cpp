// cat, stack, chunk, index_select, gather, scatter, scatter_add, embedding_bag and batched matmul:
// values against scalar loops, gradients against finite differences, bad indices and shapes.
#include "support.hpp"

namespace {

using dl::Tensor;
using I64 = Tensor<std::int64_t>;

dl::Context& ctx() {
    static dl::Context c({.seed = 11, .threads = 2});
    return c;
}
Tensor<double> randn(const dl::Shape& s) { return dl::normal<double>(s, 0, 1, ctx()); }

}  // namespace

TEST_CASE("cat and stack place each part, and send each part its slice of the gradient") {
    const auto a = randn({2, 3}), b = randn({2, 1}), c = randn({2, 2});
    const auto joined = dl::cat(std::vector{a, b, c}, 1);
    CHECK(joined.shape() == dl::Shape{2, 6});
    for (std::int64_t i = 0; i < 2; ++i) {
        CHECK(joined(i, 0) == a(i, 0));
        CHECK(joined(i, 3) == b(i, 0));
        CHECK(joined(i, 5) == c(i, 1));
    }
    CHECK_GRAD([](const auto& x, const auto& y, const auto& z) { return dl::cat(std::vector{x, y, z}, -1); }, a, b, c);
    CHECK_GRAD([](const auto& x) { return dl::cat(std::vector<Tensor<double>>{x, x.t().t() * 2.0}, 0); }, a);  // one input twice

    const auto s = dl::stack(std::vector<Tensor<double>>{a, a * 2.0}, 1);
    CHECK(s.shape() == dl::Shape{2, 2, 3});
    CHECK(s(1, 1, 2) == a(1, 2) * 2.0);
    CHECK_GRAD([](const auto& x, const auto& y) { return dl::stack(std::vector{x, y}, 2); }, a, randn({2, 3}));

    // Integer tensors join too (no gradient).
    const auto ints = dl::cat(std::vector{dl::tensor<std::int32_t>({1, 2}), dl::tensor<std::int32_t>({3})});
    CHECK(dl_test::to_vector(ints) == std::vector<std::int32_t>{1, 2, 3});

    CHECK(dl_test::error_message([&] { (void)dl::cat(std::vector{a, randn({3, 3})}, 1); }).find("only dimension 1") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::stack(std::vector{a, b}); }).find("[2, 1]") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::cat(std::vector<Tensor<double>>{}); }).find("at least one") !=
          std::string::npos);
}

TEST_CASE("chunk splits into views, the last one shorter") {
    const auto x = dl_test::iota<float>({7, 2});
    const auto parts = dl::chunk(x, 3, 0);
    REQUIRE(parts.size() == 3);
    CHECK(parts[0].shape() == dl::Shape{3, 2});
    CHECK(parts[2].shape() == dl::Shape{1, 2});
    CHECK(parts[2](0, 1) == 13);
    CHECK(parts[1].shares_storage(x));
    CHECK(dl::chunk(x, 20, 0).size() == 7);
}

TEST_CASE("index_select along each dimension, with repeats, against a scalar loop") {
    const auto x = randn({4, 3, 5});
    const I64 idx = dl::tensor<std::int64_t>({3, 0, 3, 1});
    for (int d = 0; d < 3; ++d) {
        CAPTURE(d);
        const I64 ix = d == 1 ? dl::tensor<std::int64_t>({2, 2, 0}) : idx;
        const auto y = dl::index_select(x, d, ix);
        bool same = true;
        dl_test::for_each_index(y.shape(), [&](const std::int64_t* p) {
            std::int64_t q[3] = {p[0], p[1], p[2]};
            q[d] = ix(p[d]);
            same = same && y(p[0], p[1], p[2]) == x(q[0], q[1], q[2]);
        });
        CHECK(same);
        CHECK_GRAD([&](const auto& a) { return dl::index_select(a, d, ix); }, x);
        CHECK_GRAD([&](const auto& a) { return dl::index_select(a.transpose(0, 2), d, ix); }, x);  // strided source
    }
    // Empty index: an empty result, and no gradient anywhere.
    CHECK(dl::index_select(x, 1, I64({0})).shape() == dl::Shape{4, 0, 5});
    CHECK(dl_test::error_message([&] { (void)dl::index_select(x, 0, dl::tensor<std::int64_t>({1, 4})); })
              .find("index 4 at position 1") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::index_select(x, 0, dl::tensor<std::int64_t>({-1})); })
              .find("index -1") != std::string::npos);
}

TEST_CASE("gather, scatter and scatter_add against scalar loops, with gradients") {
    const auto x = randn({3, 4});
    const auto ix = dl::tensor<std::int32_t>({{3, 0, 3}, {1, 1, 2}});  // smaller than x in both dimensions
    const auto g = dl::gather(x, 1, ix);
    CHECK(g.shape() == dl::Shape{2, 3});
    for (std::int64_t i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < 3; ++j) CHECK(g(i, j) == x(i, ix(i, j)));
    CHECK_GRAD([&](const auto& a) { return dl::gather(a, 1, ix); }, x);
    CHECK_GRAD([&](const auto& a) { return dl::gather(a, 0, dl::tensor<std::int32_t>({{2, 0, 2, 1}, {1, 1, 0, 0}})); }, x);

    const auto src = randn({2, 3});
    const auto added = dl::scatter_add(x, 1, ix, src);
    auto expected = dl_test::to_vector(x);
    for (std::int64_t i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < 3; ++j) expected[static_cast<std::size_t>(i * 4 + ix(i, j))] += src(i, j);
    const auto got = dl_test::to_vector(added);
    for (std::size_t k = 0; k < got.size(); ++k) CHECK(got[k] == doctest::Approx(expected[k]));
    CHECK_GRAD([&](const auto& a, const auto& s) { return dl::scatter_add(a, 1, ix, s); }, x, src);

    const auto unique = dl::tensor<std::int64_t>({{2, 0}, {1, 3}});
    const auto written = dl::scatter(x, 1, unique, src);
    CHECK(written(0, 2) == src(0, 0));
    CHECK(written(1, 3) == src(1, 1));
    CHECK(written(0, 1) == x(0, 1));
    CHECK(x(0, 2) != src(0, 0));  // the input is not modified
    CHECK_GRAD([&](const auto& a, const auto& s) { return dl::scatter(a, 1, unique, s); }, x, src);

    CHECK(dl_test::error_message([&] { (void)dl::gather(x, 1, dl::full<std::int64_t>({1, 1}, 4)); }).find("index 4") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::gather(x, 1, dl::tensor<std::int64_t>({1})); }).find("rank") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::gather(x, 1, I64({4, 1})); }).find("dimension 0") != std::string::npos);
}

TEST_CASE("embedding_bag: sum, mean and max bags, per-sample weights, empty bags") {
    const auto w = randn({6, 3});
    const I64 ids = dl::tensor<std::int64_t>({1, 4, 4, 0, 5});
    const I64 offsets = dl::tensor<std::int64_t>({0, 3, 3});  // bags {1, 4, 4}, {}, {0, 5}
    const auto psw = randn({5});
    for (auto mode : {dl::bag_mode::sum, dl::bag_mode::mean, dl::bag_mode::max}) {
        CAPTURE(static_cast<int>(mode));
        const auto y = dl::embedding_bag(w, ids, offsets, mode);
        CHECK(y.shape() == dl::Shape{3, 3});
        const std::int64_t bounds[] = {0, 3, 3, 5};
        for (std::int64_t b = 0; b < 3; ++b)
            for (std::int64_t k = 0; k < 3; ++k) {
                double ref = mode == dl::bag_mode::max ? -1e300 : 0;
                for (std::int64_t j = bounds[b]; j < bounds[b + 1]; ++j)
                    ref = mode == dl::bag_mode::max ? std::max(ref, w(ids(j), k)) : ref + w(ids(j), k);
                if (bounds[b] == bounds[b + 1]) ref = 0;
                else if (mode == dl::bag_mode::mean) ref /= double(bounds[b + 1] - bounds[b]);
                CHECK(y(b, k) == doctest::Approx(ref));
            }
        CHECK_GRAD([&](const auto& t) { return dl::embedding_bag(t, ids, offsets, mode); }, w);
    }
    CHECK_GRAD([&](const auto& t, const auto& s) { return dl::embedding_bag(t, ids, offsets, dl::bag_mode::sum, s); }, w, psw);

    // The weight's gradient is zero outside the rows looked up.
    Tensor<double> table = w.clone().requires_grad_();
    dl::sum(dl::embedding_bag(table, ids, offsets)).backward();
    for (std::int64_t k = 0; k < 3; ++k) CHECK(table.grad()(2, k) == 0);

    CHECK(dl_test::error_message([&] { (void)dl::embedding_bag(w, ids, dl::tensor<std::int64_t>({1, 3})); })
              .find("start at 0") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::embedding_bag(w, ids, dl::tensor<std::int64_t>({0, 9})); })
              .find("offset 1 is 9") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::embedding_bag(w, dl::tensor<std::int64_t>({6}), dl::tensor<std::int64_t>({0})); })
              .find("index 6") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::embedding_bag(w, ids, offsets, dl::bag_mode::mean, psw); })
              .find("mode sum") != std::string::npos);
}

TEST_CASE("batched matmul against per-batch products, with gradients") {
    const auto a = randn({3, 2, 4}), b = randn({3, 4, 5});
    const auto c = dl::matmul(a, b);
    CHECK(c.shape() == dl::Shape{3, 2, 5});
    for (std::int64_t i = 0; i < 3; ++i)
        CHECK(dl_test::same_elements(c.select(0, i), dl::matmul(a.select(0, i), b.select(0, i)), 1e-12));
    CHECK_GRAD([](const auto& x, const auto& y) { return dl::matmul(x, y); }, a, b);
    CHECK_GRAD([](const auto& x, const auto& y) { return dl::matmul(y.transpose(1, 2), x.transpose(1, 2)); }, a, b);
    CHECK(dl_test::error_message([&] { (void)dl::matmul(a, randn({2, 4, 5})); }).find("[3, 2, 4] and [2, 4, 5]") !=
          std::string::npos);
}
