// Tensor<T>: construction, element access, handle semantics, fill / clone / copy_from, over every
// element type.
#include "support.hpp"

#include <cstring>

using dl::Shape;
using dl::Tensor;
using dl_test::error_message;
using dl_test::to_vector;

namespace {
/// A value of T that differs between neighbouring i (within what T can hold).
template <class T>
T value_at(std::int64_t i) {
    if constexpr (std::is_same_v<T, bool>)
        return i % 2 == 1;
    else if constexpr (std::is_same_v<T, std::uint8_t>)
        return static_cast<T>(i % 251);
    else
        return static_cast<T>(i);
}

bool aligned_64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }
}  // namespace

TEST_CASE_TEMPLATE("Tensor<T> reports the dtype of T", T, DL_ELEMENT_TYPES) {
    constexpr dl::DType expected = std::is_same_v<T, float>          ? dl::DType::float32
                                   : std::is_same_v<T, double>       ? dl::DType::float64
                                   : std::is_same_v<T, std::int32_t> ? dl::DType::int32
                                   : std::is_same_v<T, std::int64_t> ? dl::DType::int64
                                   : std::is_same_v<T, std::uint8_t> ? dl::DType::uint8
                                                                     : dl::DType::boolean;
    CHECK(Tensor<T>::dtype() == expected);
    CHECK(Tensor<T>({2}).dtype() == expected);
    CHECK(dl::dtype_of<T> == expected);
}

TEST_CASE("dtype names") {
    CHECK(dl::dtype_name(dl::DType::boolean) == "bool");
    CHECK(dl::dtype_name(dl::DType::uint8) == "uint8");
    CHECK(dl::dtype_name(dl::DType::int32) == "int32");
    CHECK(dl::dtype_name(dl::DType::int64) == "int64");
    CHECK(dl::dtype_name(dl::DType::float32) == "float32");
    CHECK(dl::dtype_name(dl::DType::float64) == "float64");
    CHECK(dl_test::to_string(dl::DType::float32) == "float32");
}

TEST_CASE_TEMPLATE("Tensor<T> of rank 0 to 6 has the shape, contiguous strides and aligned data asked for", T,
                   DL_ELEMENT_TYPES) {
    const Shape shapes[] = {{}, {5}, {2, 3}, {2, 3, 4}, {1, 2, 3, 2}, {2, 1, 3, 1, 2}, {2, 2, 1, 3, 2, 2}};
    dl::Context ctx({.threads = 1});
    for (const Shape& shape : shapes) {
        CAPTURE(shape);
        Tensor<T> t(shape, ctx);
        CHECK(t.shape() == shape);
        CHECK(t.rank() == shape.size());
        CHECK(t.numel() == shape.numel());
        CHECK(t.strides() == dl::contiguous_strides(shape));
        CHECK(t.offset() == 0);
        CHECK(t.is_contiguous());
        CHECK(t.defined());
        CHECK(t.owns_memory());
        CHECK(&t.context() == &ctx);
        CHECK(t.storage().bytes() >= static_cast<std::size_t>(t.numel()) * sizeof(T));
        CHECK(aligned_64(t.data()));
        for (int d = 0; d < t.rank(); ++d) {
            CHECK(t.shape(d) == shape[d]);
            CHECK(t.shape(d - t.rank()) == shape[d]);  // negative dims count from the end
        }
    }
}

TEST_CASE_TEMPLATE("Tensor<T> data is 64-byte aligned for every size", T, DL_ELEMENT_TYPES) {
    dl::Context ctx({.threads = 1});
    for (std::int64_t n : {0, 1, 2, 3, 7, 15, 16, 17, 63, 64, 65, 1000, 4097, 100000}) {
        CAPTURE(n);
        Tensor<T> t({n}, ctx);
        CHECK(aligned_64(t.data()));
    }
}

TEST_CASE("Tensor accepts rank 8 and rejects rank 9 and negative extents") {
    Tensor<float> t({1, 2, 1, 2, 1, 2, 1, 2});
    CHECK(t.rank() == dl::max_rank);
    CHECK(t.numel() == 16);
    CHECK_THROWS_AS(Tensor<float>({1, 1, 1, 1, 1, 1, 1, 1, 1}), dl::error);
    CHECK_THROWS_WITH_AS(Tensor<float>({2, -1}), "dl::Tensor: negative extent in shape [2, -1]", dl::error);
}

TEST_CASE_TEMPLATE("Tensor<T> operator() and at() address the same row-major elements", T, DL_ELEMENT_TYPES) {
    Tensor<T> t({2, 3, 4});
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = value_at<T>(i);
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 4; ++k) {
                const T expected = value_at<T>(i * 12 + j * 4 + k);
                CHECK(t(i, j, k) == expected);
                CHECK(t.at(i, j, k) == expected);
                CHECK(&t.at(i, j, k) == &t(i, j, k));
            }
    // Writes through the returned reference.
    t.at(1, 2, 3) = value_at<T>(1);
    CHECK(t.data()[23] == value_at<T>(1));
    // Index types may be mixed.
    CHECK(&t(std::int64_t{1}, 0u, short{2}) == t.data() + 14);
}

TEST_CASE("at() works for rank 6 and rank 0") {
    auto t = dl_test::iota<std::int64_t>({2, 1, 3, 1, 2, 2});
    CHECK(t.at(1, 0, 2, 0, 1, 1) == 23);
    CHECK(t.at(0, 0, 1, 0, 1, 0) == 6);
    CHECK(t(1, 0, 0, 0, 0, 1) == 13);
    auto s = dl::scalar_tensor<double>(2.5);
    CHECK(s.at() == 2.5);
    CHECK(s() == 2.5);
}

TEST_CASE_TEMPLATE("at() throws dl::error for an out-of-range index or a wrong index count", T, DL_ELEMENT_TYPES) {
    Tensor<T> t({2, 3});
    CHECK_THROWS_AS((void)t.at(2, 0), dl::error);
    CHECK_THROWS_AS((void)t.at(0, 3), dl::error);
    CHECK_THROWS_AS((void)t.at(-1, 0), dl::error);
    CHECK_THROWS_AS((void)t.at(0), dl::error);
    CHECK_THROWS_AS((void)t.at(0, 0, 0), dl::error);
    CHECK_THROWS_AS((void)t.at(), dl::error);
    CHECK_NOTHROW((void)t.at(1, 2));
}

TEST_CASE("at() error messages name the index, the dimension and the shape") {
    Tensor<float> t({2, 3});
    CHECK(error_message([&] { (void)t.at(0, 3); }) ==
          "dl::Tensor::at: index 3 out of range for dimension 1 of shape [2, 3]");
    CHECK(error_message([&] { (void)t.at(1); }) == "dl::Tensor::at: 1 indices for a tensor of shape [2, 3]");
}

TEST_CASE_TEMPLATE("item() returns the only element and throws for any other count", T, DL_ELEMENT_TYPES) {
    CHECK(dl::scalar_tensor<T>(value_at<T>(7)).item() == value_at<T>(7));
    Tensor<T> one({1, 1, 1});
    one.data()[0] = value_at<T>(5);
    CHECK(one.item() == value_at<T>(5));
    CHECK_THROWS_AS((void)Tensor<T>({2}).item(), dl::error);
    CHECK_THROWS_AS((void)Tensor<T>({0}).item(), dl::error);
    CHECK(error_message([] { (void)Tensor<T>({2, 3}).item(); }) ==
          "dl::Tensor::item: tensor of shape [2, 3] has 6 elements");
}

TEST_CASE_TEMPLATE("fill() sets every element, also through a strided view", T, DL_ELEMENT_TYPES) {
    Tensor<T> t({3, 5});
    t.fill(value_at<T>(0));
    t.slice(1, 0, 5, 2).fill(value_at<T>(3));
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 5; ++j) CHECK(t(i, j) == value_at<T>(j % 2 == 0 ? 3 : 0));
}

TEST_CASE_TEMPLATE("clone() copies elements into independent, contiguous storage", T, DL_ELEMENT_TYPES) {
    Tensor<T> t({4, 3});
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = value_at<T>(i);
    const auto view = t.t();  // non-contiguous source
    Tensor<T> c = view.clone();
    CHECK(c.shape() == Shape{3, 4});
    CHECK(c.is_contiguous());
    CHECK_FALSE(c.shares_storage(t));
    CHECK(c.data() != t.data());
    CHECK(to_vector(c) == to_vector(view));
    t.fill(value_at<T>(2));  // the clone does not see later writes
    CHECK(c(2, 1) == value_at<T>(1 * 3 + 2));
}

TEST_CASE("clone() of empty and rank-0 tensors") {
    const auto empty = dl::zeros<float>({2, 0, 3});
    const auto c = empty.clone();
    CHECK(c.shape() == Shape{2, 0, 3});
    CHECK(c.defined());
    CHECK_FALSE(c.shares_storage(empty));
    const auto s = dl::scalar_tensor<std::int64_t>(-9);
    const auto sc = s.clone();
    CHECK(sc.rank() == 0);
    CHECK(sc.item() == -9);
    CHECK(sc.data() != s.data());
}

TEST_CASE_TEMPLATE("copying a Tensor copies the handle, not the elements", T, DL_ELEMENT_TYPES) {
    Tensor<T> a({4});
    a.fill(value_at<T>(0));
    Tensor<T> b = a;  // copy construction: same elements
    CHECK(b.shares_storage(a));
    CHECK(b.data() == a.data());
    CHECK(a.storage().use_count() == 2);
    b(3) = value_at<T>(1);
    CHECK(a(3) == value_at<T>(1));
    Tensor<T> moved = std::move(b);
    CHECK(moved.data() == a.data());
    CHECK(a.storage().use_count() == 2);
}

TEST_CASE("assigning an lvalue Tensor rebinds the handle; assigning to a view copies elements") {
    Tensor<float> a = dl::full<float>({2, 3}, 1.0f);
    Tensor<float> b = dl::full<float>({2, 3}, 2.0f);
    Tensor<float> a_alias = a;

    a = b;  // lvalue: a now refers to b's elements
    CHECK(a.shares_storage(b));
    CHECK(to_vector(a_alias) == std::vector<float>(6, 1.0f));  // the old elements are untouched

    Tensor<float> c = dl::full<float>({3}, 5.0f);
    a_alias.select(0, 1) = c;  // rvalue view: elements copied into a_alias's storage
    CHECK(to_vector(a_alias) == std::vector<float>{1, 1, 1, 5, 5, 5});
    CHECK_FALSE(a_alias.shares_storage(c));
    c.fill(7.0f);
    CHECK(a_alias(1, 0) == 5.0f);

    // A named view is an lvalue: assigning a Tensor to it rebinds the name, the base stays as it was.
    auto row = a_alias.select(0, 0);
    row = c;
    CHECK(row.shares_storage(c));
    CHECK(to_vector(a_alias) == std::vector<float>{1, 1, 1, 5, 5, 5});
}

TEST_CASE("assigning a number or an expression to an lvalue Tensor writes its elements in place") {
    Tensor<float> a = dl::zeros<float>({2, 2});
    Tensor<float> alias = a;
    a = 3.0f;
    CHECK(to_vector(alias) == std::vector<float>(4, 3.0f));
    a = alias * 2.0f + 1.0f;  // in place: the alias sees it
    CHECK(a.shares_storage(alias));
    CHECK(to_vector(alias) == std::vector<float>(4, 7.0f));
    a = 2;  // an int converts to the element type
    CHECK(to_vector(alias) == std::vector<float>(4, 2.0f));
}

TEST_CASE("an expression assigned to a null Tensor allocates it with the expression's shape and context") {
    dl::Context ctx({.threads = 1});
    const auto x = dl_test::iota<float>({2, 3}, ctx);
    Tensor<float> y;
    CHECK_FALSE(y.defined());
    y = x + 1.0f;
    CHECK(y.defined());
    CHECK(y.shape() == Shape{2, 3});
    CHECK(&y.context() == &ctx);
    CHECK_FALSE(y.shares_storage(x));
    CHECK(to_vector(y) == std::vector<float>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("a null Tensor has rank 0, numel 1, no storage, and a null data pointer") {
    Tensor<float> t;
    CHECK_FALSE(t.defined());
    CHECK_FALSE(t.owns_memory());
    CHECK(t.rank() == 0);
    CHECK(t.numel() == 1);
    CHECK(t.data() == nullptr);
    CHECK_FALSE(t.shares_storage(Tensor<float>{}));
}

TEST_CASE("copy_from converts element types") {
    auto ints = dl::tensor<std::int32_t>({{-2, 0, 3}, {7, 1, 0}});
    Tensor<float> f({2, 3});
    f.copy_from(ints);
    CHECK(to_vector(f) == std::vector<float>{-2, 0, 3, 7, 1, 0});

    Tensor<bool> b({2, 3});
    b.copy_from(ints);
    CHECK(to_vector(b) == std::vector<bool>{true, false, true, true, true, false});

    auto doubles = dl::tensor<double>({1.75, -1.75, 255.0});
    Tensor<std::int64_t> i64({3});
    i64.copy_from(doubles);  // truncation toward zero, as static_cast
    CHECK(to_vector(i64) == std::vector<std::int64_t>{1, -1, 255});
    Tensor<std::uint8_t> u8({3});
    u8.copy_from(i64.slice(0, 2, 3).expand({3}));
    CHECK(to_vector(u8) == std::vector<std::uint8_t>{255, 255, 255});
}

TEST_CASE("copy_from broadcasts the source to the destination's shape") {
    Tensor<float> dst = dl::zeros<float>({2, 3, 4});
    dst.copy_from(dl::tensor<float>({1, 2, 3, 4}));  // [4] -> [2, 3, 4]
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 4; ++k) CHECK(dst(i, j, k) == float(k + 1));
    dst.copy_from(dl::tensor<double>({10, 20, 30}).reshape({3, 1}));  // [3, 1] -> [2, 3, 4], converting
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 4; ++k) CHECK(dst(i, j, k) == float(10 * (j + 1)));
    dst.copy_from(dl::scalar_tensor<std::int32_t>(9));  // rank 0 -> anything
    CHECK(to_vector(dst) == std::vector<float>(24, 9.0f));
}

TEST_CASE("copy_from rejects a source that does not broadcast to the destination, naming both shapes") {
    Tensor<float> dst = dl::zeros<float>({2, 3});
    const std::string wrong = error_message([&] { dst.copy_from(dl::zeros<float>({4})); });
    CHECK(wrong.find("[2, 3]") != std::string::npos);
    CHECK(wrong.find("[4]") != std::string::npos);
    // Broadcastable together, but the result is bigger than the destination.
    Tensor<float> row = dl::zeros<float>({1, 3});
    const std::string bigger = error_message([&] { row.copy_from(dl::zeros<float>({2, 3})); });
    CHECK(bigger == "dl::assign: cannot write an expression of shape [2, 3] into a tensor of shape [1, 3]");
    CHECK(to_vector(dst) == std::vector<float>(6, 0.0f));
}

TEST_CASE("copy_from between overlapping views of one tensor reads the source before writing") {
    auto t = dl_test::iota<float>({6});
    t.slice(0, 1, 6).copy_from(t.slice(0, 0, 5));  // shift right by one, numpy semantics
    CHECK(to_vector(t) == std::vector<float>{0, 0, 1, 2, 3, 4});

    auto m = dl_test::iota<float>({3, 3});
    m.copy_from(m.t());  // in-place transpose
    CHECK(to_vector(m) == std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8});
}

// --- null tensors: writing or cloning must not crash ---

TEST_CASE("filling a null Tensor throws dl::error (or allocates it) instead of writing through null") {
    // Run in a child process: at the time of writing this dereferences a null pointer.
    const int outcome = dl_test::exit_code_in_child([] {
        Tensor<float> t;
        try {
            t.fill(1.0f);
        } catch (const dl::error&) {
            return 0;
        }
        return t.defined() && t.data() != nullptr && t.item() == 1.0f ? 0 : 1;
    });
    CHECK_MESSAGE(outcome == 0, "child process: ", dl_test::describe_child_outcome(outcome));
}

TEST_CASE("cloning a null Tensor gives a null Tensor (or throws dl::error) instead of reading through null") {
    const int outcome = dl_test::exit_code_in_child([] {
        const Tensor<float> t;
        try {
            const Tensor<float> c = t.clone();
            return c.defined() ? 1 : 0;
        } catch (const dl::error&) {
            return 0;
        }
    });
    CHECK_MESSAGE(outcome == 0, "child process: ", dl_test::describe_child_outcome(outcome));
}
