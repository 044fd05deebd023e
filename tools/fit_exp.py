#!/usr/bin/env python3
"""Fits the polynomial dl's float exp/expm1/sigmoid/tanh kernels share (include/dl/expr/math.hpp):

    e^r - 1 ~= r + r^2 P(r),  |r| <= ln2/2 (+ slack for the rounding of the reduction),

minimising the maximum error of e^r - 1 relative to itself (which also bounds e^r's relative error),
by Lawson's iteratively reweighted least squares; coefficients are rounded to float one at a time,
refitting the rest. Prints the coefficients and the float32 error of r + r^2 P(r) evaluated with FMAs.
Dev tool: needs numpy and mpmath (pip install numpy mpmath); the build does not use it.
"""
import sys

import mpmath
import numpy as np

DEG = int(sys.argv[1]) if len(sys.argv) > 1 else 4  # degree of P
R = 0.3466 + 2e-4
mpmath.mp.dps = 40
r = np.cos(np.linspace(np.pi, 0, 4001)) * R
r = r[np.abs(r) > 1e-6]
em = np.array([float(mpmath.expm1(mpmath.mpf(v))) for v in r])
g = (em - r) / r**2  # what P approximates
w_err = r**2 / np.abs(em)  # error in P -> relative error of e^r - 1


def fit(fixed):
    w = np.ones_like(r)
    free = [k for k in range(DEG + 1) if fixed[k] is None]
    for it in range(100):
        rhs = g.copy()
        for k in range(DEG + 1):
            if fixed[k] is not None:
                rhs -= fixed[k] * r**k
        A = np.stack([r**k for k in free], axis=1) * (w * w_err)[:, None]
        sol, *_ = np.linalg.lstsq(A, rhs * w * w_err, rcond=None)
        c = np.array([fixed[k] if fixed[k] is not None else 0.0 for k in range(DEG + 1)])
        c[free] = sol
        err = (np.polyval(c[::-1], r) - g) * w_err
        w = w * np.sqrt(np.abs(err) / np.abs(err).max() + 1e-300)
        w /= w.max()
    return c, np.abs(err).max()


fixed = [None] * (DEG + 1)
c, e = fit(fixed)
print(f"degree {DEG}: max relative error {e:.3e}")
for k in range(DEG + 1):
    fixed[k] = float(np.float32(c[k]))
    if k < DEG:
        c, e = fit(fixed)
c = np.array(fixed)
e = np.abs((np.polyval(c[::-1], r) - g) * w_err).max()
print(f"float coefficients: max relative error {e:.3e}")

cf = np.array(c, dtype=np.float32)
rf = r.astype(np.float32)
p = np.full_like(rf, cf[DEG])
for k in range(DEG - 1, -1, -1):
    p = np.float32(p.astype(np.float64) * rf + cf[k])  # fma
got = np.float32(p.astype(np.float64) * np.float32(rf * rf) + rf).astype(np.float64)
ulp = np.spacing(np.abs(em).astype(np.float32)).astype(np.float64)
print(f"float32 evaluation of e^r - 1: max {np.max(np.abs(got - em) / ulp):.2f} ulp")
print("P coefficients (ascending):", ", ".join(f"{v:.9e}f" for v in cf))
