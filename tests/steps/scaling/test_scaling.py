"""The scaling-law fits: recovery of known laws (both forms) and of IsoFLOP optima, goodness of fit, the
interval, the pre-check that picks a method, errors, and the step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline import StepDeclarationError
from steps.models import MoeModelConfig, parameter_counts, tiny_moe
from steps.scaling.fit import (
    ScalingFitConfig,
    ScalingPoint,
    active_non_embedding_params,
    preview,
    scaling_fit,
    scaling_fit_step,
)
from steps.scaling.isoflop import IsoflopUnavailable, fit_isoflop, isoflop_interval
from steps.scaling.law import (
    LawFit,
    ScalingFitError,
    fit_law,
    goodness_of_fit,
    leave_one_out,
    prediction_error,
    prediction_interval,
)

TRUE = LawFit.of("chinchilla", E=1.6, A=400.0, alpha=0.45, B=1500.0, beta=0.4)
# A law with an N x D interaction: data and parameters share one bracket.
TRUE_KAPLAN = LawFit.of("kaplan", E=0.7, N_c=1.2e4, alpha=0.7, D_c=8e4, beta=2.0)
TARGET_N, TARGET_D = 3e6, 3e7


def grid(
    noise: float, seed: int = 0, sizes: int = 5, budgets: int = 5, law: LawFit = TRUE
) -> tuple[np.ndarray, ...]:
    """Points of `law` on a log grid, with multiplicative log-normal noise of `noise`."""
    n, d = np.meshgrid(np.geomspace(1e4, 1e6, sizes), np.geomspace(1e5, 1e7, budgets))
    n, d = n.ravel(), d.ravel()
    rng = np.random.default_rng(seed)
    return n, d, law.predict(n, d) * np.exp(rng.normal(0.0, noise, n.size))


def test_fit_recovers_a_known_law_from_noisy_points():
    n, d, loss = grid(noise=0.002)
    law = fit_law(n, d, loss)
    fitted, true = law.as_dict(), TRUE.as_dict()
    assert fitted["alpha"] == pytest.approx(true["alpha"], abs=0.05)
    assert fitted["beta"] == pytest.approx(true["beta"], abs=0.05)
    assert fitted["E"] == pytest.approx(true["E"], abs=0.1)
    # Beyond the grid in both N and D, the fitted law still predicts the true loss closely.
    assert law.predict(TARGET_N, TARGET_D) == pytest.approx(TRUE.predict(TARGET_N, TARGET_D), rel=0.01)
    quality = goodness_of_fit(law, n, d, loss)
    assert quality["r2"] > 0.999
    assert len(quality["residuals"]) == n.size


def test_fit_recovers_a_known_law_at_the_sizes_of_a_real_ladder():
    # The hero's ladder: N of 4e7 to 2.6e9, D of 4.6e10 to 1.8e11. The grid's best starts alone all
    # shared exponents whose D term is flat there and ended 14% off at the hero's size.
    law = LawFit.of("chinchilla", E=1.69, A=406.4, alpha=0.34, B=410.7, beta=0.28)  # Hoffmann et al.
    n, d = np.meshgrid(np.geomspace(4.2e7, 2.6e9, 5), np.array([4.6e10, 9.2e10, 1.85e11]))
    n, d = n.ravel(), d.ravel()
    fit = fit_law(n, d, law.predict(n, d), form="chinchilla")
    for name, value in law.as_dict().items():
        assert fit.as_dict()[name] == pytest.approx(value, rel=0.01), name
    assert fit.predict(2.1e10, 1.8e13) == pytest.approx(law.predict(2.1e10, 1.8e13), rel=1e-4)


def test_kaplan_form_recovers_an_interacting_law_that_chinchilla_cannot_extrapolate():
    n, d, loss = grid(noise=0.002, law=TRUE_KAPLAN)
    kaplan, chinchilla = fit_law(n, d, loss, form="kaplan"), fit_law(n, d, loss, form="chinchilla")
    fitted, true = kaplan.as_dict(), TRUE_KAPLAN.as_dict()
    assert fitted["alpha"] == pytest.approx(true["alpha"], abs=0.1)
    assert fitted["beta"] == pytest.approx(true["beta"], abs=0.2)
    truth = TRUE_KAPLAN.predict(TARGET_N, TARGET_D)
    assert kaplan.predict(TARGET_N, TARGET_D) == pytest.approx(truth, rel=0.01)
    # The additive form fits the grid worse and misses beyond it: it has no N x D term.
    assert chinchilla.objective > 3 * kaplan.objective
    kaplan_error = abs(kaplan.predict(TARGET_N, TARGET_D) / truth - 1)
    assert abs(chinchilla.predict(TARGET_N, TARGET_D) / truth - 1) > 3 * kaplan_error


def test_law_from_public_parameters_round_trips():
    assert TRUE.as_dict() == pytest.approx({"E": 1.6, "A": 400.0, "alpha": 0.45, "B": 1500.0, "beta": 0.4})
    assert TRUE.predict(1e4, 1e5) == pytest.approx(1.6 + 400 / 1e4**0.45 + 1500 / 1e5**0.4)
    assert TRUE_KAPLAN.predict(1e4, 1e5) == pytest.approx(0.7 + ((1.2e4 / 1e4) ** 0.35 + 8e4 / 1e5) ** 2.0)
    assert "N_c" in TRUE_KAPLAN.formula() or "/N)" in TRUE_KAPLAN.formula()


def test_an_unknown_form_is_refused():
    n, d, loss = grid(noise=0.0, sizes=3, budgets=2)
    with pytest.raises(ScalingFitError, match="unknown law 'kaplan2'") as e:
        fit_law(n, d, loss, form="kaplan2")
    assert e.value.field == "laws"


def isoflop_grid(law: LawFit = TRUE, noise: float = 0.0) -> tuple[np.ndarray, ...]:
    """Five sizes x three budgets, as the sweep lays them out: enough for IsoFLOP profiles."""
    n = np.repeat(np.geomspace(2e4, 1.2e5, 5), 3)
    d = np.tile([2.5e5, 5e5, 1e6], 5)
    rng = np.random.default_rng(5)
    return n, d, law.predict(n, d) * np.exp(rng.normal(0.0, noise, n.size))


def test_isoflop_finds_the_compute_optimal_size_of_a_known_law():
    law = LawFit.of("chinchilla", E=0.5, A=900.0, alpha=0.5, B=3000.0, beta=0.5)
    n, d, loss = isoflop_grid(law)
    fit = fit_isoflop(n, d, loss)
    assert len(fit.profiles) == 5 and all(len(p.log_n) >= 3 for p in fit.profiles)
    for profile in fit.profiles:
        # The true optimum on this budget: minimize L(N, C / 6N) over N numerically.
        sizes = np.geomspace(1e4, 3e5, 20001)
        true_best = sizes[np.argmin(law.predict(sizes, profile.compute / (6 * sizes)))]
        log_best, best_loss, inside = profile.minimum()
        assert inside
        assert math.exp(log_best) == pytest.approx(true_best, rel=0.15)
        assert best_loss == pytest.approx(
            float(law.predict(true_best, profile.compute / (6 * true_best))), rel=0.01
        )
    # With alpha = beta, Chinchilla's N* grows as C^(beta / (alpha + beta)) = C^0.5.
    assert fit.size_law[1] == pytest.approx(0.5, abs=0.1)
    low, high = isoflop_interval(
        n, d, loss * np.exp(np.random.default_rng(0).normal(0, 0.01, n.size)), 2e5, 2e6, resamples=40
    )
    assert low < high


def test_isoflop_needs_three_sizes_on_three_budgets():
    n, d, loss = grid(noise=0.0, sizes=3, budgets=3)
    with pytest.raises(IsoflopUnavailable, match="3 sizes per budget") as e:
        fit_isoflop(n, d, loss)
    assert e.value.field == "points"


def test_noiseless_points_are_fitted_exactly():
    n, d, loss = grid(noise=0.0, sizes=3, budgets=3)
    law = fit_law(n, d, loss)
    quality = goodness_of_fit(law, n, d, loss)
    assert quality["rmse"] < 1e-3
    assert max(abs(r) for r in quality["residuals"]) < 2e-3


def test_goodness_of_fit_numbers():
    law = LawFit.of("chinchilla", E=1.0, A=1e-300, alpha=1.0, B=1e-300, beta=1.0)  # L = 1 everywhere
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


def step_config(tmp_path, *, sizes=(16, 32, 64), budgets=(1e5, 3e5, 1e6), measured=True, law=TRUE, **options):
    """A scaling_fit config over evaluations written from `law` (0.5% noise), as the executor passes it."""
    rng = np.random.default_rng(3)
    points = []
    for h in sizes:
        for tokens in budgets:
            n = active_non_embedding_params(model(h))
            loss = float(law.predict(n, tokens) * math.exp(rng.normal(0.0, 0.005)))
            evaluation = write_results(tmp_path / f"eval-d{h}-{int(tokens)}", loss)
            points.append(ScalingPoint(f"d{h}-{int(tokens)}", model(h), int(tokens), evaluation))
    target_loss = float(law.predict(active_non_embedding_params(model(128)), 3e6))
    target_eval = write_results(tmp_path / "eval-target", target_loss) if measured else None
    target = ScalingPoint("d128-3M", model(128), 3_000_000, target_eval)
    options.setdefault("resamples", 40)
    return ScalingFitConfig(points=points, target=target, output=str(tmp_path / "fit"), **options)


def test_step_writes_fit_json_and_plot_with_the_prediction_error(tmp_path):
    config = step_config(tmp_path)
    scaling_fit(config)
    fit = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert (tmp_path / "fit" / "fit.png").stat().st_size > 10_000
    assert set(fit["methods"]) == {"chinchilla", "kaplan", "isoflop"}
    chinchilla = fit["methods"]["chinchilla"]
    assert chinchilla["parameters"]["alpha"] == pytest.approx(0.45, abs=0.15)
    assert chinchilla["fit"]["num_points"] == 9 and chinchilla["fit"]["r2"] > 0.99
    # Three sizes on a log grid share no compute budget: IsoFLOP says why it cannot run.
    assert "3 sizes per budget" in fit["methods"]["isoflop"]["unavailable"]
    assert [p["label"] for p in fit["points"]][:2] == ["d16-100000", "d16-300000"]
    for p in fit["points"]:
        assert set(p["predicted"]) == {"chinchilla", "kaplan"}
        assert p["compute_flops"] == 6.0 * p["active_non_embedding_params"] * p["tokens"]
    # The pre-check holds out the three points of largest compute, largest first.
    assert fit["pre_check"]["points"] == ["d64-1000000", "d64-300000", "d32-1000000"]
    scores = fit["pre_check"]["mean_abs_relative_error"]
    assert fit["pre_check"]["chosen"] == min(scores, key=scores.get)
    for name in ("chinchilla", "kaplan"):
        check = fit["methods"][name]["pre_check"]
        assert scores[name] == pytest.approx(np.mean(np.abs(check["relative_errors"])))
    target = fit["target"]
    assert target["method"] == fit["pre_check"]["chosen"]
    assert target["predicted_loss"] == fit["methods"][target["method"]]["target"]["predicted_loss"]
    assert target["interval"]["low"] <= target["predicted_loss"] <= target["interval"]["high"]
    assert target["interval"]["method"] == "residual bootstrap in log space"
    assert target["error"]["absolute"] == pytest.approx(target["measured_loss"] - target["predicted_loss"])
    assert abs(target["error"]["relative"]) < 0.05


def test_pre_check_picks_the_form_that_extrapolates_an_interacting_law(tmp_path):
    # Five sizes x three budgets: every method runs, IsoFLOP included.
    config = step_config(
        tmp_path, sizes=(24, 32, 40, 48, 64), budgets=(256_000, 512_000, 1_024_000), law=TRUE_KAPLAN
    )
    result = scaling_fit(config)
    assert "unavailable" not in result["methods"]["isoflop"]
    assert result["methods"]["isoflop"]["profiles"]
    scores = result["pre_check"]["mean_abs_relative_error"]
    assert set(scores) == {"chinchilla", "kaplan", "isoflop"}
    assert result["pre_check"]["chosen"] == "kaplan"
    assert abs(result["target"]["error"]["relative"]) < 0.05
    assert result["target"]["error"]["inside_interval"]


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


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"laws": ["chinchilla", "hoffmann"]}, "laws", "unknown law 'hoffmann'"),
        ({"laws": ["kaplan", "kaplan"]}, "laws", "named twice"),
        ({"laws": [], "isoflop": False}, "laws", "no method to fit"),
        ({"pre_check": 0}, "pre_check", "give 1 to 8"),
    ],
)
def test_step_declaration_refuses_bad_methods(tmp_path, options, field, words):
    config = step_config(tmp_path)
    with pytest.raises(StepDeclarationError, match=words) as e:
        scaling_fit_step("scaling/fit", points=config.points, target=config.target, **options)
    assert e.value.step == "scaling/fit" and e.value.field == field


def test_preview_shows_the_grid_and_the_target(tmp_path):
    text = preview(step_config(tmp_path))
    lines = text.splitlines()
    # This grid's sizes do not overlap on three compute budgets: IsoFLOP is said not to run.
    assert lines[0].startswith("fit chinchilla, kaplan to 9 points") and "3 largest" in lines[0]
    assert lines[1].startswith("  isoflop cannot run on this grid")
    assert len(lines) == 3 + 9 + 1
    assert "d16-100000" in lines[3]
    assert f"{active_non_embedding_params(model(128)):,}" in lines[-1]
    assert lines[-1].endswith("<- target")


def test_preview_promises_isoflop_only_where_the_grid_can_give_it_profiles(tmp_path):
    """Regression: the plan said "fit chinchilla, kaplan, isoflop" for a grid of 3 sizes x 2
    budgets, which holds no three budgets of three sizes; the run then fitted two laws."""
    config = step_config(tmp_path, budgets=(1e5, 1e6))
    lines = preview(config).splitlines()
    assert lines[0].startswith("fit chinchilla, kaplan to 6 points"), lines[0]
    assert lines[1].startswith("  isoflop cannot run on this grid: ") and "add sizes or budgets" in lines[1]
    step = scaling_fit_step("scaling/fit", points=config.points, target=config.target, resamples=40)
    assert step.description.startswith("fit chinchilla, kaplan to 6 points")
