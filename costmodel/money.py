"""Sums of money as people read them: plain decimals, never exponents.

A 9-second local run costs a few millionths of a dollar, and `$5.584e-06` reads as a typo; `$0.00000558`
does not. Sums of a dollar or more are to the cent; smaller ones keep three significant digits.
"""

from __future__ import annotations

import math

MAX_PLACES = 10  # a tenth of a nanodollar; anything smaller is shown as below it


def usd(value: float | None, places: int = 2, digits: int = 3) -> str:
    """'$1,234.56' (`places` decimals) for a dollar or more; below a dollar, `digits` significant digits in plain
    decimals ('$0.0166', '$0.00000558'); '-' for None."""
    if value is None:
        return "-"
    if value == 0:
        return f"${0:.{places}f}"
    if abs(value) >= 1:
        return f"${value:,.{places}f}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    if decimals > MAX_PLACES:
        return f"{'-' if value < 0 else ''}<${10.0 ** -MAX_PLACES:.{MAX_PLACES}f}"
    return f"${value:.{max(decimals, places)}f}"
