"""Numbers read from metadata that anyone may have edited: which ones are usable.

JSON reads `1e999` as infinity and `1e300` as a float that no clock or duration formatter can
take. Values of the right type but out of range are treated like values of the wrong type: the
record holding them is damaged (`.status`, `.lease`: CORRUPT with the usual way out) or the value
is not shown (a report, a manifest's timing). Pure functions, no I/O.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MAX_TIME", "finite_number", "finite_or_none", "usable_time"]

MAX_TIME = 253402300799.0
"""9999-12-31 23:59:59 UTC in seconds since the epoch: the last moment a `datetime` can hold."""


def finite_number(value: Any) -> bool:
    """Whether `value` is an int or float (not a bool) that is finite."""
    if type(value) is int:  # exact types: JSON decodes to exact types, and a bool is not a number here
        return abs(value) <= 2**63
    return type(value) is float and math.isfinite(value)


def usable_time(value: Any) -> bool:
    """Whether `value` is a time in seconds since the epoch that clocks and calendars can hold:
    a finite number between 0 and the end of year 9999."""
    return finite_number(value) and 0 <= value <= MAX_TIME


def finite_or_none(value: Any) -> float | None:
    """A finite float, else None (a NaN loss is a gap in a chart, not an invalid JSON document)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
