// NaN, infinities, zeros and subnormals through every unary elementwise op, on the SIMD path
// (contiguous operands) and on the scalar path (strided operands): NaN in gives NaN out, and the
// IEEE/C99 limits hold (exp(+inf) = inf, exp(-inf) = 0, sigmoid and tanh saturate, ...).
#include "special_check.hpp"

using namespace expr_test;

TEST_CASE_TEMPLATE("NaN and infinity through arithmetic unary ops", T, float, double) {
    check_specials<T>("neg", EXPR_UNARY(dl::neg), {{qnan, qnan}, {inf, -inf}, {-inf, inf}});
    check_specials<T>("abs", EXPR_UNARY(dl::abs), {{qnan, qnan}, {-inf, inf}, {inf, inf}, {-0.0, 0.0}});
    check_specials<T>("square", EXPR_UNARY(dl::square), {{qnan, qnan}, {-inf, inf}});
    check_specials<T>("sqrt", EXPR_UNARY(dl::sqrt), {{qnan, qnan}, {inf, inf}, {-1, qnan}, {0, 0}, {-inf, qnan}});
    check_specials<T>("rsqrt", EXPR_UNARY(dl::rsqrt), {{qnan, qnan}, {0, inf}, {inf, 0}, {-1, qnan}});
    check_specials<T>("reciprocal", EXPR_UNARY(dl::reciprocal),
                      {{qnan, qnan}, {0.0, inf}, {-0.0, -inf}, {inf, 0}, {-inf, 0}});
    check_specials<T>("relu", EXPR_UNARY(dl::relu), {{qnan, qnan}, {inf, inf}, {-inf, 0}});
    check_specials<T>("leaky_relu", EXPR_UNARY(dl::leaky_relu), {{qnan, qnan}, {inf, inf}, {-inf, -inf}});
    check_specials<T>("floor", EXPR_UNARY(dl::floor), {{qnan, qnan}, {inf, inf}, {-inf, -inf}});
    check_specials<T>("ceil", EXPR_UNARY(dl::ceil), {{qnan, qnan}, {inf, inf}, {-inf, -inf}});
    check_specials<T>("round", EXPR_UNARY(dl::round), {{qnan, qnan}, {inf, inf}, {-inf, -inf}});
    check_specials<T>("sign", EXPR_UNARY(dl::sign), {{qnan, qnan}, {inf, 1}, {-inf, -1}, {0.0, 0.0}, {1e-30, 1}});
    check_specials<T>("isnan", EXPR_UNARY(dl::isnan), {{qnan, 1}, {inf, 0}, {-inf, 0}, {0, 0}});
    check_specials<T>("isfinite", EXPR_UNARY(dl::isfinite), {{qnan, 0}, {inf, 0}, {-inf, 0}, {0, 1}, {-1e30, 1}});
}

TEST_CASE_TEMPLATE("NaN and infinity through transcendental unary ops", T, float, double) {
    check_specials<T>("exp", EXPR_UNARY(dl::exp), {{qnan, qnan}, {inf, inf}, {-inf, 0}, {1000, inf}, {-1000, 0}});
    check_specials<T>("exp2", EXPR_UNARY(dl::exp2), {{qnan, qnan}, {inf, inf}, {-inf, 0}, {5000, inf}, {-5000, 0}});
    check_specials<T>("expm1", EXPR_UNARY(dl::expm1), {{qnan, qnan}, {inf, inf}, {-inf, -1}, {1000, inf}});
    check_specials<T>("log", EXPR_UNARY(dl::log), {{qnan, qnan}, {0, -inf}, {-1, qnan}, {inf, inf}, {-inf, qnan}});
    check_specials<T>("log2", EXPR_UNARY(dl::log2), {{qnan, qnan}, {0, -inf}, {-1, qnan}, {inf, inf}});
    check_specials<T>("log1p", EXPR_UNARY(dl::log1p), {{qnan, qnan}, {-1, -inf}, {-2, qnan}, {inf, inf}});
    check_specials<T>("sin", EXPR_UNARY(dl::sin), {{qnan, qnan}, {inf, qnan}, {-inf, qnan}});
    check_specials<T>("cos", EXPR_UNARY(dl::cos), {{qnan, qnan}, {inf, qnan}, {-inf, qnan}});
    check_specials<T>("tanh", EXPR_UNARY(dl::tanh), {{qnan, qnan}, {inf, 1}, {-inf, -1}, {1e4, 1}, {-1e4, -1}});
    check_specials<T>("sigmoid", EXPR_UNARY(dl::sigmoid), {{qnan, qnan}, {inf, 1}, {-inf, 0}, {1e4, 1}, {-1e4, 0}});
    check_specials<T>("silu", EXPR_UNARY(dl::silu), {{qnan, qnan}, {inf, inf}, {-1e4, 0}});
    check_specials<T>("softplus", EXPR_UNARY(dl::softplus), {{qnan, qnan}, {inf, inf}, {-inf, 0}, {1e4, 1e4}});
    check_specials<T>("gelu", EXPR_UNARY(dl::gelu), {{qnan, qnan}, {inf, inf}, {1e4, 1e4}, {-1e4, 0}});
    check_specials<T>("gelu_erf", EXPR_UNARY(dl::gelu_erf), {{qnan, qnan}, {inf, inf}, {1e4, 1e4}, {-1e4, 0}});
    check_specials<T>("elu", EXPR_UNARY(dl::elu), {{qnan, qnan}, {inf, inf}, {-inf, -1}});
}

// xsimd 8's double log and log2 mishandle subnormal inputs (log(1e-320) gives about -746.5 instead of
// -736.8): math.hpp scales them into the normal range first.
TEST_CASE("log and log2 of subnormal doubles") {
    const double sub = 1e-320;
    check_specials<double>("log", EXPR_UNARY(dl::log), {{sub, std::log(sub)}, {5e-324, std::log(5e-324)}});
    check_specials<double>("log2", EXPR_UNARY(dl::log2), {{sub, std::log2(sub)}, {5e-324, std::log2(5e-324)}});
}

TEST_CASE("log and log2 of subnormal floats") {
    const float sub = 1e-40f;
    check_specials<float>("log", EXPR_UNARY(dl::log), {{sub, std::log(static_cast<double>(sub))}});
    check_specials<float>("log2", EXPR_UNARY(dl::log2), {{sub, std::log2(static_cast<double>(sub))}});
    check_specials<float>("sqrt", EXPR_UNARY(dl::sqrt), {{sub, std::sqrt(static_cast<double>(sub))}});
}
