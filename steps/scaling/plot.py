"""The scaling fit's picture: loss against N per token budget, with the fitted curves and the
target; beside it, predicted against measured loss."""

from __future__ import annotations

from typing import Any

import numpy as np

from steps.files import save_figure
from steps.scaling.law import LawFit

__all__ = ["plot_fit"]


def plot_fit(result: dict[str, Any], law: LawFit, png_path: str) -> None:
    """Loss against N per token budget with the fitted curves and the target; predicted vs measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows, target = result["points"], result["target"]
    budgets = sorted({r["tokens"] for r in rows} | {target["tokens"]})
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(budgets)))
    all_n = [r["active_non_embedding_params"] for r in rows] + [target["active_non_embedding_params"]]
    curve_n = np.geomspace(min(all_n) / 1.3, max(all_n) * 1.3, 100)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    for color, tokens in zip(colors, budgets, strict=True):
        grid = [r for r in rows if r["tokens"] == tokens]
        label = None if grid else f"fit at the target's D = {tokens:,}"
        style = "-" if grid else "--"
        left.plot(curve_n, law.predict(curve_n, tokens), style, color=color, linewidth=1.2, label=label)
        if grid:
            left.plot(
                [r["active_non_embedding_params"] for r in grid],
                [r["loss"] for r in grid],
                "o",
                color=color,
                label=f"D = {tokens:,} tokens",
            )
    t_n, interval = target["active_non_embedding_params"], target["interval"]
    predicted = target["predicted_loss"]
    left.errorbar(
        [t_n],
        [predicted],
        yerr=[[predicted - interval["low"]], [interval["high"] - predicted]],
        fmt="D",
        color="tab:red",
        capsize=4,
        label=f"target prediction, {interval['level']:.0%} interval (D = {target['tokens']:,})",
    )
    if target["measured_loss"] is not None:
        left.plot(
            [t_n], [target["measured_loss"]], "*", color="black", markersize=12, label="target measured"
        )
    left.set_xscale("log")
    # A short log axis gets too few (or overlapping) labels: label the N of the points instead.
    ticks = sorted(set(all_n))
    left.set_xticks(ticks, [f"{v / 1000:.0f}k" for v in ticks])
    left.xaxis.set_minor_formatter(NullFormatter())
    left.set_xlabel("N: active non-embedding parameters")
    left.set_ylabel(f"validation loss ({result['loss']}, nats/token)")
    left.set_title(
        "L = {E:.2f} + {A:.3g}/N^{alpha:.2f} + {B:.3g}/D^{beta:.2f}".format(**result["parameters"]),
        fontsize=9,
    )
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=7)

    measured = [r["loss"] for r in rows]
    fitted = [r["predicted"] for r in rows]
    right.plot(measured, fitted, "o", color="tab:blue", label="grid points (in-sample)")
    held = [
        (r["loss"], r["leave_one_out_predicted"]) for r in rows if r["leave_one_out_predicted"] is not None
    ]
    if held:
        right.plot(*zip(*held, strict=True), "x", color="tab:gray", label="grid points (leave-one-out)")
    if target["measured_loss"] is not None:
        right.errorbar(
            [target["measured_loss"]],
            [predicted],
            yerr=[[predicted - interval["low"]], [interval["high"] - predicted]],
            fmt="D",
            color="tab:red",
            capsize=4,
            label="target",
        )
    values = measured + fitted + [predicted, interval["low"], interval["high"]]
    if target["measured_loss"] is not None:
        values.append(target["measured_loss"])
    lo, hi = min(values), max(values)
    pad = 0.05 * (hi - lo)
    right.plot([lo - pad, hi + pad], [lo - pad, hi + pad], ":", color="black", linewidth=1)
    right.set_xlabel("measured loss")
    right.set_ylabel("predicted loss")
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, png_path)
    plt.close(fig)
