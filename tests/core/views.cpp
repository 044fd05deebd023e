// Views: slice, select, transpose, permute, expand, squeeze/unsqueeze, flatten, reshape, contiguous,
// writing through views, and from_blob. A view shares storage and never copies.
#include "support.hpp"

using dl::Shape;
using dl::Strides;
using dl::Tensor;
using dl_test::error_message;
using dl_test::iota;
using dl_test::to_vector;

namespace {
/// Addresses of t's elements in row-major order: two tensors with equal lists alias element by element.
template <class T>
std::vector<const T*> addresses(const Tensor<T>& t) {
    std::vector<const T*> out;
    dl_test::for_each_index(t.shape(), [&](const std::int64_t* index) {
        std::int64_t pos = 0;
        for (int d = 0; d < t.rank(); ++d) pos += index[d] * t.strides()[d];
        out.push_back(t.data() + pos);
    });
    return out;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

// --- slice ---

TEST_CASE("slice selects start, start+step, ... < stop and shares storage") {
    auto t = iota<int>({10});
    auto s = t.slice(0, 2, 8, 3);
    CHECK(s.shape() == Shape{2});
    CHECK(s.strides() == Strides{3});
    CHECK(s.shares_storage(t));
    CHECK(s.data() == t.data() + 2);
    CHECK(to_vector(s) == std::vector<int>{2, 5});
    CHECK(to_vector(t.slice(0, 0, 10)) == to_vector(t));
    CHECK(to_vector(t.slice(0, 1, 10, 4)) == std::vector<int>{1, 5, 9});
    CHECK(to_vector(t.slice(0, 0, 10, 20)) == std::vector<int>{0});
}

TEST_CASE("slice counts negative start/stop from the end and clamps out-of-range bounds") {
    auto t = iota<int>({10});
    CHECK(to_vector(t.slice(0, -3, 10)) == std::vector<int>{7, 8, 9});
    CHECK(to_vector(t.slice(0, 0, -8)) == std::vector<int>{0, 1});
    CHECK(to_vector(t.slice(0, -4, -1, 2)) == std::vector<int>{6, 8});
    CHECK(to_vector(t.slice(0, -100, 3)) == std::vector<int>{0, 1, 2});
    CHECK(to_vector(t.slice(0, 7, 100)) == std::vector<int>{7, 8, 9});
    CHECK(to_vector(t.slice(0, -100, 100, 4)) == std::vector<int>{0, 4, 8});
}

TEST_CASE("slice gives an empty view when the range is empty") {
    auto t = iota<int>({4, 5});
    CHECK(t.slice(1, 3, 3).shape() == Shape{4, 0});
    CHECK(t.slice(1, 4, 2).shape() == Shape{4, 0});  // stop before start
    CHECK(t.slice(0, 10, 20).shape() == Shape{0, 5});
    CHECK(t.slice(0, -1, -2).shape() == Shape{0, 5});
    CHECK(t.slice(0, 4, 5).numel() == 0);
    CHECK(to_vector(t.slice(1, 3, 3)).empty());
}

TEST_CASE("slice along an inner dimension, with negative dim") {
    auto t = iota<int>({3, 4});
    auto cols = t.slice(-1, 1, 4, 2);
    CHECK(cols.shape() == Shape{3, 2});
    CHECK(cols.strides() == Strides{4, 2});
    CHECK_FALSE(cols.is_contiguous());
    CHECK(to_vector(cols) == std::vector<int>{1, 3, 5, 7, 9, 11});
    auto rows = t.slice(0, 1, 3);
    CHECK(rows.is_contiguous());
    CHECK(rows.offset() == 4);
    CHECK(to_vector(rows) == std::vector<int>{4, 5, 6, 7, 8, 9, 10, 11});
}

TEST_CASE("slice rejects a non-positive step and a bad dimension") {
    auto t = iota<int>({5});
    CHECK_THROWS_WITH_AS((void)t.slice(0, 0, 5, 0), "dl::slice: step must be positive, got 0", dl::error);
    CHECK_THROWS_WITH_AS((void)t.slice(0, 4, 0, -1), "dl::slice: step must be positive, got -1", dl::error);
    CHECK_THROWS_WITH_AS((void)t.slice(1, 0, 1), "dl::slice: dimension 1 out of range for rank 1", dl::error);
    CHECK_THROWS_AS((void)dl::scalar_tensor<int>(1).slice(0, 0, 1), dl::error);
}

// --- select ---

TEST_CASE("select drops a dimension, accepts negative indices and rejects out-of-range ones") {
    auto t = iota<int>({2, 3, 4});
    auto s = t.select(1, 2);
    CHECK(s.shape() == Shape{2, 4});
    CHECK(s.strides() == Strides{12, 1});
    CHECK(s.shares_storage(t));
    CHECK(to_vector(s) == std::vector<int>{8, 9, 10, 11, 20, 21, 22, 23});
    CHECK(to_vector(t.select(1, -1)) == to_vector(s));
    CHECK(to_vector(t.select(-1, 0)) == std::vector<int>{0, 4, 8, 12, 16, 20});
    CHECK(t.select(0, 1).select(0, 1).select(0, 1).rank() == 0);
    CHECK(t.select(0, 1).select(0, 1).select(0, 1).item() == 17);

    CHECK_THROWS_WITH_AS((void)t.select(1, 3), "dl::select: index 3 out of range for dimension 1 of shape [2, 3, 4]",
                         dl::error);
    CHECK_THROWS_AS((void)t.select(1, -4), dl::error);
    CHECK_THROWS_AS((void)t.select(3, 0), dl::error);
    CHECK_THROWS_AS((void)t.slice(1, 0, 0).select(1, 0), dl::error);  // empty dimension has no index
}

// --- transpose / t / permute ---

TEST_CASE("transpose and t() swap shape and strides without copying") {
    auto m = iota<int>({2, 3});
    auto mt = m.t();
    CHECK(mt.shape() == Shape{3, 2});
    CHECK(mt.strides() == Strides{1, 3});
    CHECK(mt.data() == m.data());
    CHECK_FALSE(mt.is_contiguous());
    CHECK(to_vector(mt) == std::vector<int>{0, 3, 1, 4, 2, 5});
    CHECK(mt.t().is_contiguous());
    CHECK(to_vector(mt.t()) == to_vector(m));

    auto t = iota<int>({2, 3, 4});
    auto tt = t.transpose(0, -1);
    CHECK(tt.shape() == Shape{4, 3, 2});
    CHECK(tt.strides() == Strides{1, 4, 12});
    CHECK(tt(3, 1, 1) == t(1, 1, 3));
    CHECK(to_vector(t.transpose(1, 1)) == to_vector(t));
    CHECK_THROWS_AS((void)t.t(), dl::error);
    CHECK_THROWS_AS((void)iota<int>({3}).t(), dl::error);
    CHECK_THROWS_AS((void)t.transpose(0, 3), dl::error);
}

TEST_CASE("permute reorders dimensions and rejects repeated or missing ones") {
    auto t = iota<int>({2, 3, 4});
    auto p = t.permute({2, 0, 1});
    CHECK(p.shape() == Shape{4, 2, 3});
    CHECK(p.strides() == Strides{1, 12, 4});
    CHECK(p.shares_storage(t));
    for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 2; ++b)
            for (int c = 0; c < 3; ++c) CHECK(p(a, b, c) == t(b, c, a));
    CHECK(t.permute({-1, -3, -2}).shape() == Shape{4, 2, 3});
    CHECK(to_vector(t.permute({0, 1, 2})) == to_vector(t));

    CHECK_THROWS_WITH_AS((void)t.permute({0, 2, 2}), "dl::permute: dimension 2 repeated in [0, 2, 2]", dl::error);
    CHECK_THROWS_AS((void)t.permute({0, -1, 2}), dl::error);  // -1 is 2
    CHECK_THROWS_AS((void)t.permute({0, 1}), dl::error);
    CHECK_THROWS_AS((void)t.permute({0, 1, 3}), dl::error);
}

// --- expand / broadcast_to ---

TEST_CASE("expand broadcasts size-1 and new leading dimensions with stride 0") {
    auto col = iota<int>({3, 1});
    auto e = col.expand({2, 3, 4});
    CHECK(e.shape() == Shape{2, 3, 4});
    CHECK(e.strides() == Strides{0, 1, 0});
    CHECK(e.data() == col.data());
    CHECK_FALSE(e.is_contiguous());
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 4; ++k) CHECK(&e(i, j, k) == &col(j, 0));
    auto b = col.broadcast_to({3, 5});
    CHECK(b.strides() == Strides{1, 0});
    CHECK(to_vector(b) == std::vector<int>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2});
    CHECK(iota<int>({1}).expand({0}).shape() == Shape{0});
    CHECK(dl::scalar_tensor<int>(4).expand({2, 2}).strides() == Strides{0, 0});
    CHECK(to_vector(col.expand({3, 1})) == to_vector(col));
}

TEST_CASE("expand rejects shapes it cannot broadcast to, naming both shapes") {
    auto t = iota<int>({2, 3});
    CHECK_THROWS_WITH_AS((void)t.expand({2, 4}), "dl::expand: shape [2, 3] cannot broadcast to [2, 4]", dl::error);
    CHECK_THROWS_WITH_AS((void)t.expand({3}), "dl::expand: cannot expand shape [2, 3] to lower rank [3]", dl::error);
    const std::string msg = error_message([&] { (void)t.broadcast_to({3, 2, 1}); });
    CHECK(contains(msg, "[2, 3]"));
    CHECK(contains(msg, "[3, 2, 1]"));
}

TEST_CASE("expand rejects negative target extents") {
    // A negative extent is either an error or (as in PyTorch) -1 meaning "keep this extent"; it must
    // never produce a tensor with a negative extent and a negative numel.
    auto check = [](const Tensor<int>& source, const Shape& target) {
        CAPTURE(source.shape());
        CAPTURE(target);
        try {
            const auto e = source.expand(target);
            CHECK(e.numel() >= 0);
            for (auto extent : e.shape()) CHECK(extent >= 0);
        } catch (const dl::error&) {
        }
    };
    check(iota<int>({1, 3}), {-1, 3});
    check(iota<int>({3}), {-2, 3});
    check(iota<int>({2, 3}), {2, -1});
}

// --- squeeze / unsqueeze ---

TEST_CASE("unsqueeze inserts a size-1 dimension at any position, negative dims counting from the new rank") {
    auto t = iota<int>({2, 3});
    CHECK(t.unsqueeze(0).shape() == Shape{1, 2, 3});
    CHECK(t.unsqueeze(1).shape() == Shape{2, 1, 3});
    CHECK(t.unsqueeze(2).shape() == Shape{2, 3, 1});
    CHECK(t.unsqueeze(-1).shape() == Shape{2, 3, 1});
    CHECK(t.unsqueeze(-3).shape() == Shape{1, 2, 3});
    for (int d = -3; d <= 2; ++d) {
        CAPTURE(d);
        auto u = t.unsqueeze(d);
        CHECK(u.shares_storage(t));
        CHECK(u.is_contiguous());
        CHECK(to_vector(u) == to_vector(t));
    }
    CHECK_THROWS_AS((void)t.unsqueeze(3), dl::error);
    CHECK_THROWS_AS((void)t.unsqueeze(-4), dl::error);
    CHECK(dl::scalar_tensor<int>(1).unsqueeze(0).shape() == Shape{1});
    CHECK_THROWS_AS((void)iota<int>(Shape::filled(dl::max_rank, 1)).unsqueeze(0), dl::error);

    // On a non-contiguous view, the values still follow.
    auto v = t.t().unsqueeze(1);
    CHECK(v.shape() == Shape{3, 1, 2});
    CHECK(to_vector(v) == std::vector<int>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("squeeze drops size-1 dimensions, all or the one named") {
    auto t = iota<int>({1, 3, 1, 2});
    CHECK(t.squeeze().shape() == Shape{3, 2});
    CHECK(t.squeeze().strides() == Strides{2, 1});
    CHECK(t.squeeze(0).shape() == Shape{3, 1, 2});
    CHECK(t.squeeze(-2).shape() == Shape{1, 3, 2});
    CHECK(t.squeeze(1).shape() == Shape{1, 3, 1, 2});  // extent 3: unchanged
    CHECK(t.squeeze().shares_storage(t));
    CHECK(to_vector(t.squeeze()) == to_vector(t));
    CHECK(iota<int>({1, 1}).squeeze().shape() == Shape{});
    CHECK(iota<int>({1, 1}).squeeze().item() == 0);
    CHECK_THROWS_AS((void)t.squeeze(4), dl::error);
    CHECK_THROWS_AS((void)t.squeeze(-5), dl::error);
}

// --- flatten / reshape ---

TEST_CASE("flatten merges a range of dimensions") {
    auto t = iota<int>({2, 3, 4, 5});
    CHECK(t.flatten().shape() == Shape{120});
    CHECK(t.flatten(1).shape() == Shape{2, 60});
    CHECK(t.flatten(1, 2).shape() == Shape{2, 12, 5});
    CHECK(t.flatten(-2, -1).shape() == Shape{2, 3, 20});
    CHECK(t.flatten(2, 2).shape() == Shape{2, 3, 4, 5});
    CHECK(t.flatten().data() == t.data());
    CHECK(dl::scalar_tensor<int>(3).flatten().shape() == Shape{1});
    CHECK_THROWS_AS((void)t.flatten(2, 1), dl::error);
    CHECK_THROWS_AS((void)t.flatten(0, 4), dl::error);

    auto tt = t.transpose(0, 3);  // not flattenable as a view
    auto f = tt.flatten();
    CHECK_FALSE(f.shares_storage(t));
    CHECK(to_vector(f) == to_vector(tt));
}

TEST_CASE("reshape of a contiguous tensor is a view") {
    auto t = iota<int>({2, 3, 4});
    auto r = t.reshape({4, 6});
    CHECK(r.shape() == Shape{4, 6});
    CHECK(r.strides() == Strides{6, 1});
    CHECK(r.shares_storage(t));
    CHECK(r.data() == t.data());
    r(3, 5) = -1;
    CHECK(t(1, 2, 3) == -1);
    CHECK(t.reshape({24}).data() == t.data());
    CHECK(t.reshape({1, 2, 1, 12, 1}).data() == t.data());
    // Rows sliced off a contiguous tensor are still contiguous: a view with the offset kept.
    auto rows = t.reshape({6, 4}).slice(0, 2, 5);
    auto flat = rows.reshape({12});
    CHECK(flat.data() == t.data() + 8);
    CHECK(to_vector(flat) == std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
}

TEST_CASE("reshape of a transposed tensor copies when the layout cannot be a view") {
    auto m = iota<int>({2, 3});
    auto r = m.t().reshape({6});
    CHECK_FALSE(r.shares_storage(m));
    CHECK(r.is_contiguous());
    CHECK(to_vector(r) == std::vector<int>{0, 3, 1, 4, 2, 5});
    r(0) = 100;
    CHECK(m(0, 0) == 0);
}

TEST_CASE("reshape infers one -1 extent") {
    auto t = iota<int>({2, 3, 4});
    CHECK(t.reshape({-1}).shape() == Shape{24});
    CHECK(t.reshape({4, -1}).shape() == Shape{4, 6});
    CHECK(t.reshape({-1, 2, 3}).shape() == Shape{4, 2, 3});
    CHECK(iota<int>({0, 3}).reshape({-1, 3}).shape() == Shape{0, 3});
    CHECK(dl::scalar_tensor<int>(5).reshape({-1}).shape() == Shape{1});
    CHECK(iota<int>({1}).reshape({}).shape() == Shape{});
    CHECK_THROWS_WITH_AS((void)t.reshape({-1, -1}), "dl::reshape: more than one -1 in [-1, -1]", dl::error);
    CHECK_THROWS_AS((void)t.reshape({5, -1}), dl::error);
    CHECK_THROWS_AS((void)t.reshape({-2, 12}), dl::error);
}

TEST_CASE("reshape with the wrong element count names both shapes") {
    auto t = iota<int>({2, 3});
    CHECK_THROWS_WITH_AS((void)t.reshape({4, 2}),
                         "dl::reshape: cannot reshape [2, 3] (6 elements) into [4, 2] (8 elements)", dl::error);
    const std::string msg = error_message([&] { (void)t.reshape({7}); });
    CHECK(contains(msg, "[2, 3]"));
    CHECK(contains(msg, "[7]"));
}

TEST_CASE("reshape keeps row-major order for every layout and is a view exactly when it can be") {
    auto base = iota<int>({4, 6});
    struct Case {
        const char* name;
        Tensor<int> view;
    };
    const Case cases[] = {
        {"contiguous", base},
        {"rows", base.slice(0, 1, 3)},
        {"every other column", base.slice(1, 0, 6, 2)},  // [4, 3], strides [6, 2]
        {"leading columns", base.slice(1, 0, 4)},        // [4, 4], strides [6, 1]
        {"transposed", base.t()},
        {"split then permuted", base.reshape({2, 2, 6}).permute({1, 0, 2})},
        {"expanded", base.select(1, 0).unsqueeze(1).expand({4, 3})},
        {"size-1 dims", base.slice(0, 1, 2).unsqueeze(0).slice(2, 0, 6, 3)},
    };
    const Shape targets[] = {{-1},      {2, -1},    {-1, 2},       {3, -1},   {-1, 3},   {1, -1, 1},
                             {2, 2, -1}, {2, -1, 2}, {-1, 2, 1, 2}, {4, 2, -1}, {2, 3, -1}};
    for (const auto& [name, view] : cases) {
        for (const Shape& target : targets) {
            Shape known = target;
            std::int64_t rest = 1;
            for (auto e : known) rest *= e == -1 ? 1 : e;
            if (view.numel() % rest != 0) continue;
            CAPTURE(name);
            CAPTURE(view.shape());
            CAPTURE(target);
            const auto r = view.reshape(target);
            CHECK(r.numel() == view.numel());
            CHECK(to_vector(r) == to_vector(view));
            if (r.shares_storage(view))
                CHECK(addresses(r) == addresses(view));
            else
                CHECK(r.is_contiguous());
            if (view.is_contiguous()) CHECK(r.shares_storage(view));
        }
    }
    // Specific layouts that must stay views.
    auto cols = base.slice(1, 0, 6, 2);  // [4, 3] strides [6, 2]: one uniform stride of 2
    CHECK(cols.reshape({2, 2, 3}).shares_storage(base));
    CHECK(cols.reshape({2, 2, 3}).strides() == Strides{12, 6, 2});
    CHECK(cols.reshape({4, 3, 1}).shares_storage(base));
    CHECK(cols.reshape({12}).shares_storage(base));
    CHECK(cols.reshape({12}).strides() == Strides{2});
    auto leading = base.slice(1, 0, 4);  // [4, 4] strides [6, 1]: gaps between rows
    CHECK(leading.reshape({2, 2, 4}).shares_storage(base));
    CHECK(leading.reshape({2, 2, 4}).strides() == Strides{12, 6, 1});
    CHECK(leading.reshape({4, 2, 2}).strides() == Strides{6, 2, 1});
    CHECK_FALSE(leading.reshape({16}).shares_storage(base));
    CHECK_FALSE(leading.reshape({2, 8}).shares_storage(base));
    auto expanded = base.select(1, 0).unsqueeze(1).expand({4, 3});  // strides [6, 0]
    CHECK(expanded.reshape({2, 2, 3}).shares_storage(base));
    CHECK(expanded.reshape({2, 2, 3}).strides() == Strides{12, 6, 0});
    CHECK_FALSE(expanded.reshape({12}).shares_storage(base));
}

// --- contiguous / clone ---

TEST_CASE("contiguous() returns the same tensor when contiguous and a copy otherwise") {
    auto t = iota<float>({3, 4});
    auto same = t.contiguous();
    CHECK(same.data() == t.data());
    CHECK(same.shares_storage(t));
    auto rows = t.slice(0, 1, 3);
    CHECK(rows.contiguous().data() == rows.data());

    auto tt = t.t();
    auto copy = tt.contiguous();
    CHECK_FALSE(copy.shares_storage(t));
    CHECK(copy.is_contiguous());
    CHECK(copy.strides() == dl::contiguous_strides({4, 3}));
    CHECK(to_vector(copy) == to_vector(tt));

    auto e = iota<float>({3}).expand({2, 3});
    auto ec = e.contiguous();
    CHECK(ec.strides() == Strides{3, 1});
    CHECK(to_vector(ec) == std::vector<float>{0, 1, 2, 0, 1, 2});
}

TEST_CASE("is_contiguous ignores the strides of size-1 and size-0 dimensions") {
    auto t = iota<float>({3, 1, 4});
    CHECK(t.is_contiguous());
    CHECK(t.select(1, 0).unsqueeze(1).is_contiguous());
    CHECK(t.slice(0, 0, 1).is_contiguous());
    CHECK(t.slice(2, 0, 0).is_contiguous());
    CHECK(t.expand({3, 1, 4}).is_contiguous());
    CHECK_FALSE(t.slice(2, 0, 4, 2).is_contiguous());
    CHECK(t.slice(2, 0, 4, 4).is_contiguous() == false);  // [3, 1, 1] with stride 4 at dim 0
    // A size-1 dimension whose stride is not the row-major one: still contiguous.
    auto column = iota<float>({3, 4}).t().slice(1, 1, 2);  // [4, 1] strides [1, 4]: elements 4..7
    CHECK(column.strides() == Strides{1, 4});
    CHECK(column.is_contiguous());
    CHECK(column.contiguous().data() == column.data());
    CHECK(column.reshape({4}).data() == column.data());
    CHECK(dl::scalar_tensor<float>(1).expand({1, 1}).is_contiguous());  // strides [0, 0]
    CHECK(iota<float>({0, 3}).t().is_contiguous());
}

// --- writing through views ---

TEST_CASE("assigning a number to a slice writes into the base tensor") {
    auto t = dl::zeros<float>({5});
    t.slice(0, 1, 3) = 5.0f;
    CHECK(to_vector(t) == std::vector<float>{0, 5, 5, 0, 0});
    auto m = dl::zeros<int>({3, 4});
    m.slice(1, 1, 4, 2) = 7;
    m.select(0, 2) = 1;
    CHECK(to_vector(m) == std::vector<int>{0, 7, 0, 7, 0, 7, 0, 7, 1, 1, 1, 1});
}

TEST_CASE("assigning a view to a view copies elements between parts of tensors") {
    auto t = dl::zeros<float>({3, 2});
    auto other = iota<float>({2, 3});
    t.select(1, 0) = other.select(0, 1);  // column 0 of t <- row 1 of other
    CHECK(to_vector(t) == std::vector<float>{3, 0, 4, 0, 5, 0});
    t.select(1, 1) = other.t().select(1, 0);  // column 1 of t <- row 0 of other, read through a transpose
    CHECK(to_vector(t) == std::vector<float>{3, 0, 4, 1, 5, 2});
    CHECK(to_vector(other) == std::vector<float>{0, 1, 2, 3, 4, 5});
    t.slice(0, 0, 2) = other.slice(1, 0, 1).reshape({1, 2}).expand({2, 2});  // broadcast rows
    CHECK(to_vector(t) == std::vector<float>{0, 3, 0, 3, 5, 2});
}

TEST_CASE("an expression assigned to a view writes only that view") {
    auto t = iota<float>({2, 4});
    t.slice(1, 2, 4) = t.slice(1, 0, 2) * 10.0f;
    CHECK(to_vector(t) == std::vector<float>{0, 1, 0, 10, 4, 5, 40, 50});
    CHECK_THROWS_AS(t.slice(1, 0, 3) = t.slice(1, 0, 2) * 1.0f, dl::error);  // [2, 2] into [2, 3]
}

TEST_CASE("non-contiguous views of non-contiguous views address the right elements") {
    auto base = iota<int>({4, 5, 6});
    // [4, 5, 6] -> permute [6, 4, 5] -> every other of dim 0 [3, 4, 5] -> select col 3 of dim 2 [3, 4]
    //  -> step-2 slice of dim 1 [3, 2] -> transpose [2, 3]
    auto v = base.permute({2, 0, 1}).slice(0, 1, 6, 2).select(2, 3).slice(1, 1, 4, 2).t();
    CHECK(v.shape() == Shape{2, 3});
    CHECK(v.shares_storage(base));
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) {
            const int a = 1 + 2 * i, c = 1 + 2 * j;  // base index [a, 3, c]
            CHECK(v(i, j) == base(a, 3, c));
            CHECK(&v.at(i, j) == &base(a, 3, c));
        }
    v = -1;  // writes exactly those 6 elements
    int changed = 0;
    for (std::int64_t i = 0; i < base.numel(); ++i) changed += base.data()[i] == -1;
    CHECK(changed == 6);
    CHECK(base(1, 3, 1) == -1);
    CHECK(base(3, 3, 5) == -1);
    CHECK(base(2, 3, 1) == 2 * 30 + 3 * 6 + 1);

    // Views of an expanded view.
    auto e = iota<int>({3}).expand({4, 3}).t().slice(1, 1, 3);
    CHECK(e.shape() == Shape{3, 2});
    CHECK(to_vector(e) == std::vector<int>{0, 0, 1, 1, 2, 2});
}

TEST_CASE("views keep the storage alive after the base handle is gone") {
    Tensor<int> view;
    {
        auto base = iota<int>({4, 4});
        view = base.slice(0, 2, 4).t();
        CHECK(base.storage().use_count() == 2);
    }
    CHECK(view.storage().use_count() == 1);
    CHECK(to_vector(view) == std::vector<int>{8, 12, 9, 13, 10, 14, 11, 15});
}

TEST_CASE("views keep the base's context") {
    dl::Context ctx({.threads = 1});
    auto t = iota<float>({2, 3}, ctx);
    CHECK(&t.slice(0, 0, 1).context() == &ctx);
    CHECK(&t.t().reshape({6}).context() == &ctx);
    CHECK(&t.t().contiguous().context() == &ctx);
    CHECK(&t.clone().context() == &ctx);
}

// --- from_blob ---

TEST_CASE("from_blob views user memory without allocating") {
    dl::Context ctx({.threads = 1});
    const auto before = ctx.allocator().stats();
    std::vector<float> buffer{1, 2, 3, 4, 5, 6};
    auto t = dl::from_blob(buffer.data(), {2, 3}, ctx);
    CHECK(ctx.allocator().stats().system_allocations == before.system_allocations);
    CHECK(ctx.allocator().stats().cache_hits == before.cache_hits);
    CHECK(ctx.allocator().stats().bytes_in_use == before.bytes_in_use);
    CHECK(t.defined());
    CHECK_FALSE(t.owns_memory());
    CHECK(&t.context() == &ctx);
    CHECK(t.data() == buffer.data());
    CHECK(t.strides() == Strides{3, 1});
    CHECK(t(1, 2) == 6.0f);

    t.select(0, 1) = 0.0f;  // writes are visible in the user's buffer
    CHECK(buffer == std::vector<float>{1, 2, 3, 0, 0, 0});
    t = t * 2.0f + 1.0f;  // in place, still no allocation
    CHECK(buffer == std::vector<float>{3, 5, 7, 1, 1, 1});
    CHECK(t.data() == buffer.data());
    auto view = t.t().slice(0, 1, 3);
    CHECK(view.shares_storage(t));
    CHECK(to_vector(view) == std::vector<float>{5, 1, 7, 1});
    CHECK(ctx.allocator().stats().system_allocations == before.system_allocations);
    CHECK(ctx.allocator().stats().cache_hits == before.cache_hits);

    // A copy of it is an ordinary owning tensor.
    auto c = t.clone();
    CHECK(c.owns_memory());
    buffer[0] = 42;
    CHECK(c(0, 0) == 3.0f);
}

TEST_CASE("from_blob with custom strides views a column-major or padded buffer") {
    // A 3x2 matrix stored column-major: elements (i, j) at i + 3 j.
    std::vector<double> col_major{1, 2, 3, 10, 20, 30};
    auto m = dl::from_blob(col_major.data(), {3, 2}, {1, 3});
    CHECK_FALSE(m.is_contiguous());
    CHECK(to_vector(m) == std::vector<double>{1, 10, 2, 20, 3, 30});
    CHECK(m.t().is_contiguous());
    m.select(1, 1) = -1.0;
    CHECK(col_major == std::vector<double>{1, 2, 3, -1, -1, -1});

    // Rows of 3 values padded to 4: the padding is never touched.
    std::vector<int> padded{0, 1, 2, 99, 3, 4, 5, 99};
    auto p = dl::from_blob(padded.data(), {2, 3}, {4, 1});
    CHECK(to_vector(p) == std::vector<int>{0, 1, 2, 3, 4, 5});
    p = 7;
    CHECK(padded == std::vector<int>{7, 7, 7, 99, 7, 7, 7, 99});
    auto flat = p.reshape({6});  // cannot be a view of padded rows: copies
    CHECK_FALSE(flat.shares_storage(p));
    CHECK(flat.owns_memory());
    CHECK(to_vector(flat) == std::vector<int>(6, 7));

    CHECK_THROWS_WITH_AS((void)dl::from_blob(padded.data(), {2, 3}, {1}),
                         "dl::from_blob: shape [2, 3] and strides [1] differ in rank", dl::error);
}

TEST_CASE("from_blob rejects negative extents, as the Tensor constructor does") {
    std::vector<float> buffer(6);
    CHECK_THROWS_AS((void)dl::from_blob(buffer.data(), {-2, 3}), dl::error);
    CHECK_THROWS_AS((void)dl::from_blob(buffer.data(), {2, -3}, {3, 1}), dl::error);
}
