"""The symbols every formula is written in, and the three things done with a formula: print it as
LaTeX, evaluate it for numbers, solve an inequality in it.

Symbols of the handout's section 8 keep the handout's names (B, D, D_FF, N_DP, N_FSDP, N_TP, C, W, S, N);
those of our Transformer are named as in `cs336sys.sizes`. All are positive reals (but the count K, which may
be 0), which is what lets sympy decide the direction of an inequality once the denominators are cleared.
"""

from __future__ import annotations

import sympy as sp

_pos = {"positive": True}

# Handout section 8 (one SwiGLU FFN layer) and the 2025 communication_accounting problem.
B = sp.Symbol("B", **_pos)  # rows of the input x: tokens in the batch
D = sp.Symbol("D", **_pos)  # d_model
D_FF = sp.Symbol("D_FF", **_pos)  # d_ff
N = sp.Symbol("N", **_pos)  # devices
N_DP, N_FSDP, N_TP = sp.symbols("N_DP N_FSDP N_TP", **_pos)
C = sp.Symbol("C", **_pos)  # FLOP/s of one device
W = sp.Symbol("W", **_pos)  # egress bandwidth of one device, bytes/s
S = sp.Symbol("S", **_pos)  # bytes of the tensor a collective works on
X, Y = sp.symbols("X Y", **_pos)  # Scaling Book mesh: FSDP axis X, tensor-parallel axis Y
M_X, M_Y = sp.symbols("M_X M_Y", **_pos)  # mesh axes each of them spans
F = sp.Symbol("F", **_pos)  # the Scaling Book's name for d_ff
P = sp.Symbol("P", **_pos)  # parameters
T = sp.Symbol("T", **_pos)  # tokens whose activations are kept
M_dev = sp.Symbol("M_dev", **_pos)  # memory of one device, bytes

# Our Transformer (cs336sys.model).
L = sp.Symbol("L", **_pos)  # blocks
d = sp.Symbol("d_model", **_pos)
f = sp.Symbol("d_ff", **_pos)
h = sp.Symbol("h", **_pos)  # heads
V = sp.Symbol("V", **_pos)  # vocabulary
b = sp.Symbol("b", **_pos)  # sequences in the batch
s = sp.Symbol("s", **_pos)  # context length
K = sp.Symbol("K", integer=True, nonnegative=True)  # blocks activation-checkpointed (0 <= K <= L)
c = sp.Symbol("c", **_pos)  # tokens per cross-entropy chunk, when the loss is computed in chunks

LATEX_NAMES = {
    D_FF: r"D_{\mathrm{FF}}", N_DP: r"N_{\mathrm{DP}}", N_FSDP: r"N_{\mathrm{FSDP}}", N_TP: r"N_{\mathrm{TP}}",
    M_dev: r"M_{\mathrm{dev}}", d: r"d_{\mathrm{model}}", f: r"d_{\mathrm{ff}}", K: r"K_{\mathrm{ckpt}}",
}


def latex(expr: sp.Basic | str) -> str:
    """LaTeX of a formula, with the handout's subscripts (pandoc turns it into Typst math)."""
    if isinstance(expr, str):
        return expr
    return sp.latex(expr, symbol_names=LATEX_NAMES, mul_symbol=None)


def _exact(value) -> sp.Basic:
    if isinstance(value, bool):
        raise TypeError("a boolean is not a value for a formula")
    if isinstance(value, int):
        return sp.Integer(value)
    if isinstance(value, float):
        return sp.Rational(value)  # the float's exact binary value, so integers stay integers
    return sp.sympify(value)


def evaluate(expr: sp.Basic, values: dict) -> int | float:
    """The number a formula takes for `values` ({symbol: number}): an int when the result is a whole
    number of exact inputs (bytes, FLOPs, parameters), else a float."""
    out = sp.sympify(expr).subs({k: _exact(v) for k, v in values.items()})
    if out.free_symbols:
        raise ValueError(f"no value for {sorted(map(str, out.free_symbols))} in {expr}")
    return int(out) if out.is_Integer else float(out)


def bound(inequality: sp.Rel, var: sp.Symbol) -> sp.Rel:
    """Solve `inequality` for `var` with sympy: the denominators (products of positive symbols) are
    cleared first, so sympy sees a polynomial whose sign it can decide; returns `var <= expr` or
    `var >= expr` (or the strict forms). Where `var` appears under a square root, it is solved for
    its root (a positive symbol) and the bound squared, which keeps its direction."""
    expr = inequality.lhs - inequality.rhs
    if expr.has(sp.sqrt(var)):
        root = sp.Symbol(f"sqrt_{var}", positive=True)
        rel = bound(type(inequality)(expr.subs(var, root**2), 0), root)
        return type(rel)(var, sp.expand(sp.simplify(rel.rhs**2)))
    num, den = sp.fraction(sp.together(expr))
    if not den.is_positive:
        raise ValueError(f"cannot tell the sign of {den}; give the symbols positive=True")
    solved = sp.solve(type(inequality)(sp.expand(num), 0), var)
    parts = solved.args if isinstance(solved, sp.And) else (solved,)
    # Drop the conditions positivity already gives (0 < var, var < oo).
    kept = [r for r in parts if not (r.has(sp.oo) or (0 in (r.lhs, r.rhs)))]
    if len(kept) != 1:
        raise ValueError(f"expected one bound on {var}, sympy gave {solved}")
    rel = kept[0]
    if rel.rhs == var:  # put the variable on the left
        rel = rel.reversed
    return type(rel)(rel.lhs, sp.expand(sp.simplify(rel.rhs)))
