// Shape / Dims: extents, equality, printing, strides, broadcasting and dimension wrapping.
#include "support.hpp"

using dl::Shape;
using dl_test::error_message;
using dl_test::to_string;

TEST_CASE("Dims holds up to max_rank extents and counts their product") {
    CHECK(Shape{}.size() == 0);
    CHECK(Shape{}.empty());
    CHECK(Shape{}.numel() == 1);  // rank 0: one element
    CHECK(Shape{7}.numel() == 7);
    CHECK(Shape{2, 3, 4}.numel() == 24);
    CHECK(Shape{2, 0, 4}.numel() == 0);
    CHECK(Shape{1, 1, 1}.numel() == 1);

    const Shape full{1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(full.size() == dl::max_rank);
    CHECK(full.numel() == 40320);
    CHECK(full.back() == 8);

    const std::int64_t raw[] = {4, 5, 6};
    const Shape from_span{std::span<const std::int64_t>(raw)};
    CHECK(from_span == Shape{4, 5, 6});
    CHECK(Shape::filled(3, 9) == Shape{9, 9, 9});
}

TEST_CASE("Dims::checked_numel gives the product, or nothing when it overflows or an extent is negative") {
    constexpr std::int64_t big = std::int64_t(1) << 32;
    CHECK(Shape{}.checked_numel() == 1);
    CHECK(Shape{2, 3, 4}.checked_numel() == 24);
    CHECK(Shape{2, 0, 4}.checked_numel() == 0);
    CHECK(Shape{big, big / 4}.checked_numel() == std::int64_t(1) << 62);
    CHECK(Shape{big, big / 2}.checked_numel() == std::nullopt);  // 2^63: one past int64's largest
    CHECK(Shape{big, big}.checked_numel() == std::nullopt);  // numel() wraps this to 0
    CHECK(Shape{std::numeric_limits<std::int64_t>::max(), 2}.checked_numel() == std::nullopt);
    CHECK(Shape{big, big, 0}.checked_numel() == std::nullopt);  // 0 elements, but its strides overflow
    CHECK(Shape{3, -1}.checked_numel() == std::nullopt);
    static_assert(Shape{4, 5}.checked_numel() == 20);
}

TEST_CASE("Dims rejects more than max_rank extents") {
    Shape s = Shape::filled(dl::max_rank, 1);
    CHECK_THROWS_AS(s.push_back(1), dl::error);
    CHECK(s.size() == dl::max_rank);
    CHECK_THROWS_AS((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), dl::error);
    CHECK_THROWS_AS(Shape{}.resize(dl::max_rank + 1), dl::error);
    CHECK_THROWS_AS(Shape{}.resize(-1), dl::error);
    CHECK(error_message([] { Shape{1}.resize(9); }) == "dl: rank 9 outside [0, 8]");
}

TEST_CASE("Dims insert, erase and resize edit in place") {
    Shape s{2, 3};
    s.insert(0, 1);
    CHECK(s == Shape{1, 2, 3});
    s.insert(3, 5);
    CHECK(s == Shape{1, 2, 3, 5});
    s.insert(2, 7);
    CHECK(s == Shape{1, 2, 7, 3, 5});
    s.erase(0);
    CHECK(s == Shape{2, 7, 3, 5});
    s.erase(3);
    CHECK(s == Shape{2, 7, 3});
    s.resize(5, 4);
    CHECK(s == Shape{2, 7, 3, 4, 4});
    s.resize(1);
    CHECK(s == Shape{2});
}

TEST_CASE("Dims equality compares rank and every extent") {
    CHECK(Shape{2, 3} == Shape{2, 3});
    CHECK_FALSE(Shape{2, 3} == Shape{3, 2});
    CHECK_FALSE(Shape{2, 3} == Shape{2, 3, 1});
    CHECK_FALSE(Shape{1} == Shape{});
    CHECK(Shape{} == Shape{});
    // Stale values beyond the rank do not matter.
    Shape a{2, 3, 4};
    a.resize(2);
    CHECK(a == Shape{2, 3});
}

TEST_CASE("Dims prints as a bracketed list") {
    CHECK(to_string(Shape{}) == "[]");
    CHECK(to_string(Shape{5}) == "[5]");
    CHECK(to_string(Shape{2, 3, 0}) == "[2, 3, 0]");
    CHECK(to_string(Shape{-1, 4}) == "[-1, 4]");
}

TEST_CASE("Dims is usable in constant expressions") {
    constexpr Shape s{2, 3, 4};
    static_assert(s.numel() == 24);
    static_assert(dl::contiguous_strides(s) == Shape{12, 4, 1});
    CHECK(s.size() == 3);
}

TEST_CASE("contiguous_strides are row-major, treating size-0 dims as size 1") {
    CHECK(dl::contiguous_strides({}) == Shape{});
    CHECK(dl::contiguous_strides({5}) == Shape{1});
    CHECK(dl::contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});
    CHECK(dl::contiguous_strides({2, 1, 4}) == Shape{4, 4, 1});
    CHECK(dl::contiguous_strides({2, 0, 3}) == Shape{3, 3, 1});
    CHECK(dl::contiguous_strides({1, 2, 3, 4, 5, 6, 7, 8}) == Shape{40320, 20160, 6720, 1680, 336, 56, 8, 1});
}

TEST_CASE("broadcast_shapes follows numpy rules") {
    using dl::broadcast_shapes;
    CHECK(broadcast_shapes({}, {}, "op") == Shape{});
    CHECK(broadcast_shapes({}, {2, 3}, "op") == Shape{2, 3});
    CHECK(broadcast_shapes({2, 3}, {}, "op") == Shape{2, 3});
    CHECK(broadcast_shapes({2, 3}, {2, 3}, "op") == Shape{2, 3});
    CHECK(broadcast_shapes({3, 1}, {1, 4}, "op") == Shape{3, 4});
    CHECK(broadcast_shapes({4}, {3, 1}, "op") == Shape{3, 4});
    CHECK(broadcast_shapes({5, 1, 3}, {2, 1}, "op") == Shape{5, 2, 3});
    CHECK(broadcast_shapes({1}, {1, 1, 1}, "op") == Shape{1, 1, 1});
    // size-0 dims: 0 against 1 gives 0, 0 against 0 gives 0
    CHECK(broadcast_shapes({0}, {1}, "op") == Shape{0});
    CHECK(broadcast_shapes({2, 0}, {1}, "op") == Shape{2, 0});
    CHECK(broadcast_shapes({0, 3}, {0, 1}, "op") == Shape{0, 3});
    CHECK(broadcast_shapes({}, {0}, "op") == Shape{0});
    CHECK(broadcast_shapes({1, 2, 3, 4, 5, 6, 7, 1}, {8}, "op") == Shape{1, 2, 3, 4, 5, 6, 7, 8});
}

TEST_CASE("broadcast_shapes rejects incompatible shapes, naming the op and both shapes") {
    using dl::broadcast_shapes;
    CHECK_THROWS_WITH_AS((void)broadcast_shapes({2, 3}, {4}, "add"),
                         "dl::add: shapes [2, 3] and [4] do not broadcast (dimension 1: 3 vs 4)", dl::error);
    CHECK_THROWS_WITH_AS((void)broadcast_shapes({0}, {3}, "mul"),
                         "dl::mul: shapes [0] and [3] do not broadcast (dimension 0: 0 vs 3)", dl::error);
    const std::string msg = error_message([] { (void)broadcast_shapes({5, 2, 3}, {4, 3}, "where"); });
    CHECK(msg.find("dl::where") != std::string::npos);
    CHECK(msg.find("[5, 2, 3]") != std::string::npos);
    CHECK(msg.find("[4, 3]") != std::string::npos);
}

TEST_CASE("wrap_dim accepts [-rank, rank) and names the op otherwise") {
    CHECK(dl::wrap_dim(0, 3, "op") == 0);
    CHECK(dl::wrap_dim(2, 3, "op") == 2);
    CHECK(dl::wrap_dim(-1, 3, "op") == 2);
    CHECK(dl::wrap_dim(-3, 3, "op") == 0);
    CHECK_THROWS_WITH_AS((void)dl::wrap_dim(3, 3, "slice"), "dl::slice: dimension 3 out of range for rank 3",
                         dl::error);
    CHECK_THROWS_WITH_AS((void)dl::wrap_dim(-4, 3, "select"), "dl::select: dimension -4 out of range for rank 3",
                         dl::error);
    CHECK_THROWS_AS((void)dl::wrap_dim(0, 0, "op"), dl::error);  // rank 0 has no dimensions
}
