// Determinism across thread counts: the same input evaluated in a 1-thread and a 2-thread Context (and
// under an executor that runs tasks out of order) gives bitwise identical results, for fused
// transcendental chains and for reductions over large inputs.
#include "check.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

using namespace expr_test;

namespace {

constexpr std::int64_t large = 3'000'001;

/// A copy of `t`'s elements in a new contiguous tensor of `ctx`.
template <class T>
dl::Tensor<T> copy_into(const dl::Tensor<T>& t, dl::Context& ctx) {
    dl::Tensor<T> out(t.shape(), ctx);
    const auto v = to_vector(t);
    if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(T));
    return out;
}

/// Runs tasks one at a time, last first, and claims 4-way concurrency: any result that depends on
/// the order in which chunks finish shows up.
struct reversed_executor {
    void parallel_for(std::int64_t count, dl::task_ref task) {
        for (std::int64_t i = count - 1; i >= 0; --i) task(i);
    }
    [[nodiscard]] int concurrency() const { return 4; }
};

template <class T>
void check_same_bits(const dl::Tensor<T>& one, const dl::Tensor<T>& other, std::string_view what) {
    INFO(what, ": first differing element ", first_difference(one, other));
    CHECK(bitwise_equal(one, other));
}

auto chain = [](const auto& x) {
    return dl::tanh(x) * dl::exp(x * x * -0.01f) + dl::sigmoid(x) + dl::log1p(dl::abs(x)) + dl::sin(x) * dl::gelu(x) +
           dl::softplus(x) - dl::exp(x);  // |x| up to 100: exp's overflow path in some batches
};

}  // namespace

TEST_CASE_TEMPLATE("a fused transcendental chain is bitwise identical with 1 and 2 threads", T, float, double) {
    dl::Context ctx1({.seed = 1, .threads = 1}), ctx2({.seed = 1, .threads = 2});
    const auto x1 = random<T>({large}, -100, 100, 1, 0, ctx1);
    const auto x2 = copy_into(x1, ctx2);
    const auto y1 = dl::eval(chain(x1));
    const auto y2 = dl::eval(chain(x2));
    CHECK(&y1.context() == &ctx1);
    CHECK(&y2.context() == &ctx2);
    check_same_bits(y1, y2, "contiguous chain");

    // Rows of a transposed matrix plus a broadcast row: the strided loop, split mid-row.
    const auto m1 = random<T>({1733, 1731}, -10, 10, 2, 0, ctx1);
    const auto m2 = copy_into(m1, ctx2);
    const auto r1 = random<T>({1733}, -1, 1, 3, 0, ctx1);
    const auto r2 = copy_into(r1, ctx2);
    check_same_bits(dl::eval(chain(m1.t()) * r1), dl::eval(chain(m2.t()) * r2), "transposed chain");

    // The same into a strided destination.
    auto d1 = dl::zeros<T>({1731, 3466}, ctx1), d2 = dl::zeros<T>({1731, 3466}, ctx2);
    d1.slice(1, 0, 3466, 2) = chain(m1.t());
    d2.slice(1, 0, 3466, 2) = chain(m2.t());
    check_same_bits(d1, d2, "strided destination");

    // And the same values on 1 thread, in place.
    auto z1 = x1.clone(), z2 = x2.clone();
    z1 = chain(z1);
    z2 = chain(z2);
    check_same_bits(z1, z2, "in place");
    check_same_bits(z1, y1, "in place vs new tensor");
}

TEST_CASE_TEMPLATE("reductions are bitwise identical with 1 and 2 threads", T, float, double) {
    dl::Context ctx1({.seed = 1, .threads = 1}), ctx2({.seed = 1, .threads = 2});
    const auto x1 = random<T>({large}, -3, 5, 4, 0, ctx1);
    const auto x2 = copy_into(x1, ctx2);
    check_same_bits(dl::sum(x1), dl::sum(x2), "sum");
    check_same_bits(dl::mean(x1), dl::mean(x2), "mean");
    check_same_bits(dl::var(x1), dl::var(x2), "var");
    check_same_bits(dl::std(x1, {}, false, 0), dl::std(x2, {}, false, 0), "std");
    check_same_bits(dl::logsumexp(x1), dl::logsumexp(x2), "logsumexp");
    check_same_bits(dl::norm(x1), dl::norm(x2), "norm");
    check_same_bits(dl::norm(x1, 3), dl::norm(x2, 3), "norm 3");
    check_same_bits(dl::max(x1), dl::max(x2), "max");
    check_same_bits(dl::argmin(x1), dl::argmin(x2), "argmin");
    check_same_bits(dl::sum(x1 * x1 - 1.0f), dl::sum(x2 * x2 - 1.0f), "sum of an expression");
    check_same_bits(dl::prod(x1 * 0.0001f + 1.0f), dl::prod(x2 * 0.0001f + 1.0f), "prod");

    // Many outputs: along each axis of a matrix, and over a transposed view.
    const auto m1 = random<T>({1500, 2001}, -3, 5, 5, 0, ctx1);
    const auto m2 = copy_into(m1, ctx2);
    for (const std::int64_t axis : {0, 1}) {
        CAPTURE(axis);
        check_same_bits(dl::sum(m1, {axis}), dl::sum(m2, {axis}), "sum axis");
        check_same_bits(dl::mean(m1, {axis}), dl::mean(m2, {axis}), "mean axis");
        check_same_bits(dl::var(m1, {axis}), dl::var(m2, {axis}), "var axis");
        check_same_bits(dl::logsumexp(m1, {axis}), dl::logsumexp(m2, {axis}), "logsumexp axis");
        check_same_bits(dl::argmax(m1, axis), dl::argmax(m2, axis), "argmax axis");
        check_same_bits(dl::sum(m1.t(), {axis}), dl::sum(m2.t(), {axis}), "sum axis of transpose");
    }
    // One output over a long slice that is not the whole tensor: a [1, n] tensor, keepdim.
    check_same_bits(dl::var(x1.unsqueeze(0), {1}, true), dl::var(x2.unsqueeze(0), {1}, true), "var keepdim");
}

TEST_CASE("results do not depend on the order in which an executor runs the chunks") {
    dl::Context serial({.seed = 1, .threads = 1}), odd({.seed = 1, .threads = 1});
    reversed_executor reversed;
    odd.use_executor(reversed);
    REQUIRE(odd.concurrency() == 4);
    const auto x1 = random<float>({large}, -20, 20, 6, 0, serial);
    const auto x2 = copy_into(x1, odd);
    check_same_bits(dl::eval(chain(x1)), dl::eval(chain(x2)), "chain");
    check_same_bits(dl::sum(x1), dl::sum(x2), "sum");
    check_same_bits(dl::var(x1), dl::var(x2), "var");
    check_same_bits(dl::logsumexp(x1), dl::logsumexp(x2), "logsumexp");
    check_same_bits(dl::argmax(x1), dl::argmax(x2), "argmax");
    const auto m1 = x1.slice(0, 0, 3'000'000).reshape({1000, 3000});
    const auto m2 = x2.slice(0, 0, 3'000'000).reshape({1000, 3000});
    check_same_bits(dl::mean(m1, {0}), dl::mean(m2, {0}), "mean axis 0");
    check_same_bits(dl::std(m1, {1}), dl::std(m2, {1}), "std axis 1");
}
