"""The bucketed-DDP overhead model (ddp_bucketed_benchmarking b): the time exposed after the
backward as a function of the bucket size, its optimum, and a least-squares fit of its constants.

Notation of the handout: s gradient bytes, n_b buckets of b = s / n_b bytes each, w the all-reduce's
algorithm bandwidth (bytes per rank / time), o a fixed cost per all-reduce call. Computing one
bucket's gradients takes as long as moving it (b / w, the handout's assumption). Bucket k (1..n_b) is
ready at k·b/w; its all-reduce starts when it is ready and the previous one is done:

    f_k = max(k·b/w, f_{k-1}) + o + b/w,   f_0 = 0   =>   f_k = k·o + (k+1)·b/w

(by induction: f_{k-1} = (k-1)·o + k·b/w >= k·b/w, so the queue never drains). The backward ends at
n_b·b/w, leaving

    T = f_{n_b} - n_b·b/w = n_b·o + s/(n_b·w) = s·o/b + b/w,

minimised at b* = sqrt(s·o·w) (n_b* = sqrt(s/(o·w))), where both terms equal sqrt(s·o/w).
`simulate` runs the recurrence, `exposed_time` is the closed form; the tests check they agree.
The formulas the report prints are derived here by sympy (`formulas`), not typed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np


def simulate(s: float, n_b: int, o: float, w: float, compute_per_bucket: float | None = None) -> float:
    """Exposed time after the backward of `n_b` equal buckets, by running the queue of all-reduces.
    `compute_per_bucket` defaults to the handout's assumption: the bucket's transfer time b / w."""
    b = s / n_b
    c = b / w if compute_per_bucket is None else compute_per_bucket
    done = 0.0
    for k in range(1, n_b + 1):
        done = max(k * c, done) + o + b / w
    return done - n_b * c


def exposed_time(s: float, b: float, o: float, w: float, n_max: float = math.inf) -> float:
    """The closed form n_b·o + s/(n_b·w) with n_b = s/b, at least one bucket and at most `n_max` (a
    bucket never splits a tensor, so there are at most as many buckets as gradient tensors)."""
    n_b = min(max(s / b, 1.0), n_max)
    return n_b * o + s / (n_b * w)


def optimal_bucket_bytes(s: float, o: float, w: float) -> float:
    """b* = sqrt(s·o·w), at most s (one bucket holds everything); inf where o or w is unbounded."""
    if o <= 0 or not math.isfinite(w):
        return math.inf if o > 0 or w == math.inf else 0.0
    return min(math.sqrt(s * o * w), s)


def formulas() -> dict[str, str]:
    """The model's formulas in LaTeX, derived by sympy from the recurrence's closed form.

    Written for the printed page: no sub- or superscripts and no fraction inside running text (both
    print below 8 pt; a square root
    reaches into the line above), so the report names the bucket count n (the handout's n_b), writes the queue
    as f(k), and the optimum as the bucket size where both terms of T are equal. Keys ending in
    `_inline` fold fractions to a slash; the others are set as display equations."""
    import sympy as sp

    s, o, w, b, n, k = sp.symbols("s o w b n k", positive=True)
    f_k = k * o + (k + 1) * b / w
    f_prev = f_k.subs(k, k - 1)
    # the induction step: the queue is behind the backward, so f(k) = f(k-1) + o + b/w
    assert sp.simplify(f_prev + o + b / w - f_k) == 0 and sp.simplify(f_prev - k * b / w) == (k - 1) * o
    exposed_n = sp.simplify(f_k.subs(k, n) - n * b / w).subs(b, s / n)
    exposed_b = sp.expand(exposed_n.subs(n, s / b))
    fixed_term, transfer_term = o * s / b, b / w
    assert sp.simplify(exposed_b - fixed_term - transfer_term) == 0
    # dT/db = 0, multiplied by b: the two terms are equal
    assert sp.simplify(sp.expand(b * sp.diff(exposed_b, b)) - (transfer_term - fixed_term)) == 0
    b_star = sp.solve(sp.diff(exposed_b, b), b)
    assert len(b_star) == 1
    b_star = b_star[0]
    n_star = sp.solve(sp.diff(exposed_n, n), n)[0]
    t_star = sp.simplify(exposed_b.subs(b, b_star))
    term = sp.simplify(transfer_term.subs(b, b_star))
    assert sp.simplify(t_star - 2 * term) == 0  # at the optimum the two terms are equal

    def display(e) -> str:
        return sp.latex(e, mul_symbol=None)

    def inline(e) -> str:
        return sp.latex(e, mul_symbol=None, fold_short_frac=True)

    def tidy(derived, written):  # one square root, as one writes it; checked against sympy's result
        assert sp.simplify(written.doit() - derived) == 0
        return display(written)

    def root(e):
        return sp.sqrt(sp.UnevaluatedExpr(e))

    return {"recurrence": r"f(k) = \max\left(\frac{k\,b}{w},\ f(k-1)\right) + o + \frac{b}{w}, \qquad f(0) = 0",
            "closed_form_inline": inline(f_k), "f_prev_inline": inline(f_prev), "ready_inline": inline(k * b / w),
            "exposed_n": display(exposed_n), "exposed_b": display(exposed_b),
            "equal_terms": rf"{display(fixed_term)} = {display(transfer_term)}",
            "b_star": tidy(b_star, root(o * s * w)), "n_star": tidy(n_star, root(s / (o * w))),
            "t_star": tidy(t_star, 2 * root(o * s / w)),
            "backward_end_inline": inline(n * b / w)}


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients, by trying every set of free columns (a handful of
    columns here): the best fit whose coefficients are all >= 0."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    best, best_sse = np.zeros(x.shape[1]), float(y @ y)
    for r in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), r):
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(x.shape[1])
            full[list(cols)] = coef
            sse = float(((x @ full - y) ** 2).sum())
            if sse < best_sse - 1e-15 * max(best_sse, 1.0):
                best, best_sse = full, sse
    return best


@dataclass
class Fit:
    """Constants of T = n_b·o + (s/n_b)/w fitted to measured exposed times (seconds)."""

    o_s: float  # fixed cost per all-reduce
    inv_w: float  # seconds per byte (1/w)
    predicted_s: list[float]
    residuals_s: list[float]
    r2: float | None  # None when the measurements do not vary
    dof: int  # points minus constants

    @property
    def w_bytes_per_s(self) -> float:
        return 1 / self.inv_w if self.inv_w > 0 else math.inf

    def as_dict(self) -> dict:
        """The constants and the fit's quality (the per-point lists stay on the object)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("predicted_s", "residuals_s")}
        return d | {"w_gbps": self.w_bytes_per_s / 1e9 if self.inv_w > 0 else None, "o_ms": self.o_s * 1e3}


def fit_bucket_model(n_b: list[float], s: float, exposed_s: list[float]) -> Fit:
    """Fit o >= 0 and 1/w >= 0 of T = n_b·o + (s/n_b)/w by least squares. `n_b` is each point's
    number of all-reduces per step (measured: a bucket never splits a tensor, so it is not s/b
    at small b), `exposed_s` its exposed communication in seconds."""
    n = np.asarray(n_b, float)
    y = np.asarray(exposed_s, float)
    x = np.column_stack([n, s / n])
    o, inv_w = nnls(x, y)
    pred = x @ np.array([o, inv_w])
    resid = y - pred
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else None
    return Fit(float(o), float(inv_w), pred.tolist(), resid.tolist(), r2, len(y) - 2)


def fit_latency_bandwidth(size_bytes: list[float], time_s: list[float]) -> tuple[float, float]:
    """t = o + size/w fitted (o, 1/w >= 0) to an all-reduce sweep; returns (o seconds, 1/w seconds per byte)."""
    x = np.column_stack([np.ones(len(size_bytes)), np.asarray(size_bytes, float)])
    o, inv_w = nnls(x, np.asarray(time_s, float))
    return float(o), float(inv_w)
