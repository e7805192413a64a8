"""What a device-hour costs, by device kind: the ledger's cost column.

The shipped figures are public on-demand list prices, in US dollars per device-hour (a GPU, a TPU
chip, or a CPU core), as we read them in 2025; they were not checked since, and no team pays
list price for long. Put your own in a JSON file, `{"H100": 2.5, "v5p": 3.1, ...}` (the kinds
you give replace the shipped ones, the others stay), and point `$DRYDOCK_PRICES` at it.

    TPU v4, v5e, v5p, v6e   Google Cloud TPU pricing, on-demand, us-central, per chip-hour
    H100                    AWS p5.48xlarge on-demand (8 GPUs), per GPU, after its mid-2025 cut
    A100                    Google Cloud a2-ultragpu-1g (one A100 80GB), on-demand
    CPU                     Google Cloud n2 on-demand: two vCPUs (one core), with its memory

Kinds not in the table (H200, B200, GB200, "GPU" when a step names no type) have no price until
you give one; the ledger then shows no cost rather than a guessed one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from pipeline.errors import StepDeclarationError

__all__ = ["DEFAULT_PRICES", "PRICES_ENV", "price_table"]

PRICES_ENV = "DRYDOCK_PRICES"

DEFAULT_PRICES: Mapping[str, float] = {
    "v4": 3.22,
    "v5e": 1.20,
    "v5p": 4.20,
    "v6e": 2.70,
    "H100": 6.88,
    "A100": 5.07,
    "CPU": 0.10,
}
"""US dollars per device-hour (see the module docstring for where each comes from)."""


def price_table(path: str | None = None) -> dict[str, float]:
    """The shipped prices, with those of the JSON file at `path` (else `$DRYDOCK_PRICES`, if set)
    in their place. A file that is not a JSON object of non-negative numbers is one error naming
    it (`StepDeclarationError`, field `DRYDOCK_PRICES`)."""
    table = dict(DEFAULT_PRICES)
    path = path or os.environ.get(PRICES_ENV) or None
    if path is None:
        return table
    try:
        with open(path) as f:
            given = json.load(f)
    except (OSError, ValueError) as e:
        raise StepDeclarationError(None, f"cannot read the price table {path}: {e}", field=PRICES_ENV) from e
    if not isinstance(given, dict):
        raise StepDeclarationError(None, f"{path}: a JSON object of prices by device kind", field=PRICES_ENV)
    for kind, price in given.items():
        if isinstance(price, bool) or not isinstance(price, int | float) or not price >= 0:
            problem = f"{path}: the price of {kind!r} must be a number of dollars >= 0, not {price!r}"
            raise StepDeclarationError(None, problem, field=PRICES_ENV)
        table[str(kind)] = float(price)
    return table
