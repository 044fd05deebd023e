#!/usr/bin/env python3
"""Fits the rational approximation dl uses for float tanh (include/dl/expr/math.hpp):

    tanh(x) ~= x * P(x^2) / Q(x^2),  |x| <= CLAMP,  deg P = 6, deg Q = 3, P(0) = Q(0) = 1,

minimising the maximum relative error (Lawson's iteratively reweighted least squares on the
linearised problem). Coefficients are then rounded to float one at a time, refitting the rest after
each (as fpminimax does), and the float32 evaluation is measured in ulps against mpmath.
A dev tool: needs numpy and mpmath (pip install numpy mpmath); the build does not use it.
"""
import mpmath
import numpy as np

CLAMP = 9.02  # tanh(x) rounds to 1.0f above ~9.01
DEG_P, DEG_Q = 6, 3
N = DEG_P + DEG_Q  # unknowns: p1..p6, q1..q3 (p0 = q0 = 1)

mpmath.mp.dps = 40
T = CLAMP * CLAMP
t = (np.cos(np.linspace(np.pi, 0, 6000)) + 1) / 2 * T
x = np.sqrt(t)
f = np.array([float(mpmath.tanh(mpmath.mpf(v)) / v) if v > 0 else 1.0 for v in x])


def split(c):
    return np.concatenate([[1.0], c[:DEG_P]]), np.concatenate([[1.0], c[DEG_P:]])


def fit(fixed):
    """Coefficients (in t) minimising max relative error, with fixed[k] held where not None."""
    w = np.ones_like(t)
    q_prev = np.ones_like(t)
    scale = np.array([T**k for k in range(1, DEG_P + 1)] + [T**k for k in range(1, DEG_Q + 1)])
    cols = [t**k for k in range(1, DEG_P + 1)] + [-f * t**k for k in range(1, DEG_Q + 1)]
    basis = np.stack(cols, axis=1) / scale  # columns scaled to O(1)
    free = [k for k in range(N) if fixed[k] is None]
    for it in range(80):
        rhs = f - 1.0  # P - f Q = 0 with p0 = q0 = 1 moved right
        for k in range(N):
            if fixed[k] is not None:
                rhs = rhs - basis[:, k] * fixed[k] * scale[k]
        A = basis[:, free] / (f * q_prev)[:, None] * w[:, None]
        b = rhs / (f * q_prev) * w
        sol, *_ = np.linalg.lstsq(A, b, rcond=None)
        c = np.array([fixed[k] if fixed[k] is not None else 0.0 for k in range(N)])
        c[free] = sol / scale[free]
        p, q = split(c)
        err = np.polyval(p[::-1], t) / np.polyval(q[::-1], t) / f - 1
        q_prev = np.polyval(q[::-1], t)
        if it > 5:
            w = w * np.sqrt(np.abs(err) / np.abs(err).max() + 1e-300)
            w /= w.max()
    return c, np.abs(err).max()


fixed = [None] * N
c, e = fit(fixed)
print(f"max relative error of the real-coefficient fit: {e:.3e}")
for k in sorted(range(N), key=lambda k: -abs(c[k]) * (T ** ((k % DEG_P) + 1))):  # most sensitive first
    fixed[k] = float(np.float32(c[k]))
    c, e = fit(fixed)
print(f"after rounding every coefficient to float: {e:.3e}")
pf, qf = (np.array(v, dtype=np.float32) for v in split(c))


def fma(a, b, c):  # float32 fused multiply-add: the double product of two floats is exact
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def tanh_f32(xs):
    xs = np.clip(xs.astype(np.float32), -CLAMP, CLAMP).astype(np.float32)
    z = (xs * xs).astype(np.float32)
    num = np.full_like(z, pf[DEG_P])
    for k in range(DEG_P - 1, -1, -1):
        num = fma(num, z, pf[k])
    den = np.full_like(z, qf[DEG_Q])
    for k in range(DEG_Q - 1, -1, -1):
        den = fma(den, z, qf[k])
    # Rounding can push the ratio just past 1 near saturation: clamp the result too.
    return np.clip((xs * num).astype(np.float32) / den, -1, 1)


xs = np.concatenate([np.linspace(0, 10, 2_000_001, dtype=np.float32),
                     np.geomspace(1e-30, 1, 200_001).astype(np.float32)])[::50]
got = tanh_f32(xs).astype(np.float64)
ref = np.array([float(mpmath.tanh(mpmath.mpf(float(v)))) for v in xs])
ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
e = np.abs(got - ref) / ulp
i = int(np.argmax(e))
print(f"max float32 error: {e[i]:.2f} ulp over {len(ref)} samples (worst at x = {float(xs[i])!r})")
print("P (powers of x^2, ascending):", ", ".join(f"{v:.9e}f" for v in pf))
print("Q (powers of x^2, ascending):", ", ".join(f"{v:.9e}f" for v in qf))
