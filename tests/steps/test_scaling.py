"""The scaling-law fit: recovery of a known law, goodness of fit, the interval, errors, and the step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline import StepDeclarationError
from steps.moe import MoeModelConfig, parameter_counts, tiny_moe
from steps.scaling import (
    LawFit,
    ScalingFitConfig,
    ScalingFitError,
    ScalingPoint,
    active_non_embedding_params,
    fit_law,
    goodness_of_fit,
    leave_one_out,
    prediction_error,
    prediction_interval,
    preview,
    scaling_fit,
    scaling_fit_step,
)

TRUE = LawFit(E=1.6, A=400.0, alpha=0.45, B=1500.0, beta=0.4, objective=0.0)
TARGET_N, TARGET_D = 3e6, 3e7


def grid(noise: float, seed: int = 0, sizes: int = 5, budgets: int = 5) -> tuple[np.ndarray, ...]:
    """Points of TRUE on a log grid, with multiplicative log-normal noise of `noise`."""
    n, d = np.meshgrid(np.geomspace(1e4, 1e6, sizes), np.geomspace(1e5, 1e7, budgets))
    n, d = n.ravel(), d.ravel()
    rng = np.random.default_rng(seed)
    return n, d, TRUE.predict(n, d) * np.exp(rng.normal(0.0, noise, n.size))


def test_fit_recovers_a_known_law_from_noisy_points():
    n, d, loss = grid(noise=0.002)
    law = fit_law(n, d, loss)
    assert law.alpha == pytest.approx(TRUE.alpha, abs=0.05)
    assert law.beta == pytest.approx(TRUE.beta, abs=0.05)
    assert pytest.approx(TRUE.E, abs=0.1) == law.E
    # Beyond the grid in both N and D, the fitted law still predicts the true loss closely.
    assert law.predict(TARGET_N, TARGET_D) == pytest.approx(TRUE.predict(TARGET_N, TARGET_D), rel=0.01)
    quality = goodness_of_fit(law, n, d, loss)
    assert quality["r2"] > 0.999
    assert len(quality["residuals"]) == n.size


def test_noiseless_points_are_fitted_exactly():
    n, d, loss = grid(noise=0.0, sizes=3, budgets=3)
    law = fit_law(n, d, loss)
    quality = goodness_of_fit(law, n, d, loss)
    assert quality["rmse"] < 1e-3
    assert max(abs(r) for r in quality["residuals"]) < 2e-3


def test_goodness_of_fit_numbers():
    law = LawFit(E=1.0, A=0.0, alpha=1.0, B=0.0, beta=1.0, objective=0.0)  # L = 1 everywhere
    quality = goodness_of_fit(law, [1, 2, 3], [1, 2, 3], [0.9, 1.0, 1.1])
    assert quality["residuals"] == pytest.approx([-0.1, 0.0, 0.1])
    assert quality["rmse"] == pytest.approx(math.sqrt(0.02 / 3))
    assert quality["r2"] == pytest.approx(0.0)  # no better than the mean


def test_interval_covers_the_true_loss_and_widens_with_noise():
    widths = []
    for noise in (0.002, 0.02):
        n, d, loss = grid(noise=noise, seed=1, sizes=3, budgets=3)
        law = fit_law(n, d, loss)
        low, high = prediction_interval(law, n, d, loss, TARGET_N, TARGET_D, resamples=60, seed=0)
        assert low <= law.predict(TARGET_N, TARGET_D) <= high
        assert low <= TRUE.predict(TARGET_N, TARGET_D) <= high, (noise, low, high)
        widths.append(high - low)
    assert widths[1] > 3 * widths[0]


def test_leave_one_out_predicts_held_out_points():
    n, d, loss = grid(noise=0.002, sizes=3, budgets=3)
    held_out = leave_one_out(n, d, loss)
    assert len(held_out) == 9
    # The middle point is inside the others' hull: they predict it well.
    assert held_out[4] == pytest.approx(loss[4], rel=0.02)


def test_prediction_error_inside_and_outside_the_interval():
    inside = prediction_error(2.0, 1.9, 2.1, 2.05)
    assert inside["absolute"] == pytest.approx(0.05)
    assert inside["relative"] == pytest.approx(0.05 / 2.05)
    assert inside["inside_interval"] is True
    outside = prediction_error(2.0, 1.9, 2.1, 1.5)
    assert outside["absolute"] == pytest.approx(-0.5)
    assert outside["inside_interval"] is False
    with pytest.raises(ScalingFitError, match="target"):
        prediction_error(2.0, 1.9, 2.1, float("nan"))


def test_fewer_points_than_parameters_is_refused():
    n, d, loss = grid(noise=0.0, sizes=2, budgets=2)
    with pytest.raises(ScalingFitError) as e:
        fit_law(n, d, loss)
    assert e.value.field == "points"
    assert "4 point(s) cannot fit the 5 parameters" in str(e.value)


def test_one_model_size_or_budget_is_refused():
    n, d, loss = grid(noise=0.0, sizes=1, budgets=6)
    with pytest.raises(ScalingFitError, match="same model size"):
        fit_law(n, d, loss)
    with pytest.raises(ScalingFitError, match="same token budget"):
        fit_law(d, n, loss)  # swapped: six sizes, one budget


def test_non_positive_losses_are_refused():
    n, d, loss = grid(noise=0.0, sizes=3, budgets=2)
    loss[2] = -1.0
    with pytest.raises(ScalingFitError, match=r"finite and positive; point\(s\) \[2\]"):
        fit_law(n, d, loss)


def test_active_non_embedding_params_leaves_out_embedding_and_head():
    model = MoeModelConfig(hidden_dim=64, expert_intermediate_dim=128)
    _, active = parameter_counts(model, vocab_size=1000)
    assert active_non_embedding_params(model) == active - 2 * 1000 * 64


# -- the step ------------------------------------------------------------------------------------------


def model(hidden_dim: int) -> MoeModelConfig:
    return tiny_moe(hidden_dim)


def write_results(path, loss: float, prose: float | None = None) -> str:
    path.mkdir(parents=True)
    sets = {"prose": {"loss": prose or loss}, "arithmetic": {"loss": loss}}
    (path / "results.json").write_text(json.dumps({"validation_sets": sets, "average": {"loss": loss}}))
    return str(path)


def step_config(tmp_path, *, sizes=(16, 32, 64), budgets=(1e5, 3e5, 1e6), measured=True, **options):
    """A scaling_fit config over evaluations written from TRUE (0.5% noise), as the executor passes it."""
    rng = np.random.default_rng(3)
    points = []
    for h in sizes:
        for tokens in budgets:
            n = active_non_embedding_params(model(h))
            loss = float(TRUE.predict(n, tokens) * math.exp(rng.normal(0.0, 0.005)))
            evaluation = write_results(tmp_path / f"eval-d{h}-{int(tokens)}", loss)
            points.append(ScalingPoint(f"d{h}-{int(tokens)}", model(h), int(tokens), evaluation))
    target_loss = float(TRUE.predict(active_non_embedding_params(model(128)), 3e6))
    target_eval = write_results(tmp_path / "eval-target", target_loss) if measured else None
    target = ScalingPoint("d128-3M", model(128), 3_000_000, target_eval)
    options.setdefault("resamples", 40)
    return ScalingFitConfig(points=points, target=target, output=str(tmp_path / "fit"), **options)


def test_step_writes_fit_json_and_plot_with_the_prediction_error(tmp_path):
    config = step_config(tmp_path)
    scaling_fit(config)
    fit = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert (tmp_path / "fit" / "fit.png").stat().st_size > 10_000
    assert fit["parameters"]["alpha"] == pytest.approx(TRUE.alpha, abs=0.15)
    assert fit["fit"]["num_points"] == 9 and fit["fit"]["r2"] > 0.99
    assert [p["label"] for p in fit["points"]][:2] == ["d16-100000", "d16-300000"]
    for p in fit["points"]:
        assert p["residual"] == pytest.approx(p["loss"] - p["predicted"])
        assert p["compute_flops"] == 6.0 * p["active_non_embedding_params"] * p["tokens"]
    target = fit["target"]
    assert target["interval"]["low"] <= target["predicted_loss"] <= target["interval"]["high"]
    assert target["interval"]["method"] == "residual bootstrap in log space"
    assert target["error"]["absolute"] == pytest.approx(target["measured_loss"] - target["predicted_loss"])
    assert abs(target["error"]["relative"]) < 0.05


def test_five_points_fit_but_leave_nothing_for_an_interval(tmp_path):
    n, d, loss = grid(noise=0.002, sizes=3, budgets=2)
    n, d, loss = n[:5], d[:5], loss[:5]
    law = fit_law(n, d, loss)  # five points determine the law...
    assert leave_one_out(n, d, loss) == [None] * 5  # ...but no four of them do
    with pytest.raises(ScalingFitError, match="leaving no residuals") as e:
        prediction_interval(law, n, d, loss, TARGET_N, TARGET_D)
    assert e.value.field == "points"
    config = step_config(tmp_path, sizes=(16, 32, 64), budgets=(1e5, 1e6))
    with pytest.raises(StepDeclarationError, match="give at least 6") as declared:
        scaling_fit_step("scaling/fit", points=config.points[:5], target=config.target)
    assert declared.value.step == "scaling/fit" and declared.value.field == "points"


def test_step_without_a_measured_target_reports_no_error(tmp_path):
    scaling_fit(step_config(tmp_path, measured=False))
    target = json.loads((tmp_path / "fit" / "fit.json").read_text())["target"]
    assert target["measured_loss"] is None and target["error"] is None
    assert math.isfinite(target["predicted_loss"])


def test_step_fits_one_validation_set_when_asked(tmp_path):
    config = step_config(tmp_path, loss="prose")
    scaling_fit(config)
    assert json.loads((tmp_path / "fit" / "fit.json").read_text())["loss"] == "prose"
    with pytest.raises(ScalingFitError, match="no validation set 'code'") as e:
        scaling_fit(step_config(tmp_path / "other", loss="code"))
    assert e.value.field == "loss"


def test_step_with_a_missing_evaluation_names_the_point_and_writes_nothing(tmp_path):
    config = step_config(tmp_path)
    (tmp_path / "eval-d32-100000" / "results.json").unlink()
    with pytest.raises(ScalingFitError) as e:
        scaling_fit(config)
    assert e.value.field == "points.3.evaluation"
    assert "scaling_fit" in str(e.value) and "d32-100000" in str(e.value)
    assert not (tmp_path / "fit").exists()


def test_step_declaration_refuses_too_few_points(tmp_path):
    config = step_config(tmp_path, sizes=(16, 32), budgets=(1e5, 1e6))
    with pytest.raises(StepDeclarationError) as e:
        scaling_fit_step("scaling/fit", points=config.points, target=config.target)
    assert e.value.step == "scaling/fit" and e.value.field == "points"
    assert "4 point(s) cannot fit the 5 parameters" in str(e.value)


def test_step_declaration_refuses_a_bad_interval_level(tmp_path):
    config = step_config(tmp_path)
    with pytest.raises(StepDeclarationError) as e:
        scaling_fit_step("scaling/fit", points=config.points, target=config.target, level=1.5)
    assert e.value.field == "level"


def test_preview_shows_the_grid_and_the_target(tmp_path):
    text = preview(step_config(tmp_path))
    lines = text.splitlines()
    assert len(lines) == 2 + 9 + 1
    assert "d16-100000" in lines[2]
    assert f"{active_non_embedding_params(model(128)):,}" in lines[-1]
    assert lines[-1].endswith("<- target")
