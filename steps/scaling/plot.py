"""The scaling fit's picture: loss against N per token budget, with the fitted curves and the
target; beside it, predicted against measured loss."""

from __future__ import annotations

from typing import Any

import numpy as np

from steps.files import save_figure

__all__ = ["plot_fit"]

_MARKERS = {"chinchilla": "s", "kaplan": "D", "isoflop": "^"}


def plot_fit(result: dict[str, Any], predictors: dict[str, Any], png_path: str) -> None:
    """Loss against N per token budget with the chosen method's curves and every method's prediction
    for the target; beside it the chosen method's predicted against measured loss.

    `predictors` maps a method to an object with `predict(n, d)` (a `LawFit` or an `IsoflopFit`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows, target = result["points"], result["target"]
    chosen = target["method"]
    model = predictors[chosen]

    def curve(n: np.ndarray, d: float) -> np.ndarray:
        return np.array([model.predict(float(x), float(d)) for x in n])

    budgets = sorted({r["tokens"] for r in rows} | {target["tokens"]})
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(budgets)))
    all_n = [r["active_non_embedding_params"] for r in rows] + [target["active_non_embedding_params"]]
    curve_n = np.geomspace(min(all_n) / 1.3, max(all_n) * 1.3, 100)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    for color, tokens in zip(colors, budgets, strict=True):
        grid = [r for r in rows if r["tokens"] == tokens]
        label = None if grid else f"fit at the target's D = {tokens:,}"
        style = "-" if grid else "--"
        left.plot(curve_n, curve(curve_n, tokens), style, color=color, linewidth=1.2, label=label)
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
    for offset, (name, method) in zip(
        np.linspace(0.94, 1.06, len(result["methods"])), result["methods"].items(), strict=True
    ):
        if "unavailable" in method:
            continue
        p = method["target"]
        left.errorbar(
            [t_n * offset],
            [p["predicted_loss"]],
            yerr=[
                [p["predicted_loss"] - p["interval"]["low"]],
                [p["interval"]["high"] - p["predicted_loss"]],
            ],
            fmt=_MARKERS.get(name, "o"),
            color="tab:red" if name == chosen else "tab:gray",
            capsize=4,
            label=f"{name}{' (chosen)' if name == chosen else ''}: {p['interval']['level']:.0%} interval",
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
        f"{chosen}: " + (model.formula() if hasattr(model, "formula") else "IsoFLOP profiles"), fontsize=9
    )
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=7)

    measured = [r["loss"] for r in rows]
    fitted = [r["predicted"][chosen] for r in rows]
    right.plot(measured, fitted, "o", color="tab:blue", label=f"grid points, {chosen} (in-sample)")
    held = [
        (r["loss"], r["leave_one_out_predicted"][chosen])
        for r in rows
        if r["leave_one_out_predicted"].get(chosen) is not None
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
