"""How the analysis writes numbers into its tables and prose: a reading as a number or missing, a
fixed number of decimals, a percentage, a mean with its spread, a byte count in binary units, and
`fmt`, the cell format of `common.markdown_table`."""

from __future__ import annotations

import math


def number(value) -> float | None:
    """A reading as a float, or None where it is absent (None, NaN, or not a number at all: an allocator
    reading on the CPU is null)."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def fixed(value, digits: int = 2, missing: str = "", thousands: bool = False) -> str:
    """`value` with `digits` decimals (with thousands separators if asked), or `missing` where absent."""
    v = number(value)
    if v is None:
        return missing
    return no_minus_zero(f"{v:,.{digits}f}" if thousands else f"{v:.{digits}f}")


def percent(share, digits: int = 0, missing: str = "") -> str:
    """A share (0.25) as a percentage ("25%"), or `missing` where absent."""
    v = number(share)
    return missing if v is None else no_minus_zero(f"{100 * v:.{digits}f}") + "%"


def no_minus_zero(text: str) -> str:
    """A formatted number that rounded to zero loses its sign: "-0.0" from -0.04 is printed "0.0"."""
    return text[1:] if text.startswith("-") and not text.strip("-0.,") else text


def mean_std(mean: float, std: float, digits: int = 2) -> str:
    """A mean and its spread: "12.34 ± 0.56"."""
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def significant(x: float) -> str:
    """About three significant digits, never in exponent notation (milliseconds, GB/s)."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 1 or x <= 0:
        return f"{x:.1f}" if x >= 10 else f"{x:.2f}"
    return f"{x:.{2 - math.floor(math.log10(x))}f}"


def human_bytes(n: float) -> str:
    """A byte count in the largest binary unit it reaches: "1 GiB", "256 KiB", "512 B"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def fmt(value, digits: int = 2) -> str:
    """A cell: `digits` decimals, except that a value too small for them keeps two significant digits
    (a nonzero number never prints as zero)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        if value and abs(value) < 0.5 * 10**-digits:
            return f"{value:.2g}"
        return f"{value:,.{digits}f}"
    return str(value)
