"""The predicted loss, live (issue 31, part 5): a training given a scaling fit's prediction (or
numbers) draws it, compares each evaluation with it, and warns and alerts when its evaluations
stay outside the interval; the prediction never enters the training's identity; a prediction for
another model is refused at declaration."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import StepDeclarationError
from pipeline.core.dag import build_dag
from pipeline.core.training_figures import live_figures, prediction_text
from steps.models import TINY_MOE, tiny_moe
from steps.scaling.fit import (
    ScalingFitConfig,
    ScalingPoint,
    active_non_embedding_params,
    scaling_fit,
    scaling_fit_step,
)
from steps.scaling.isoflop import fit_isoflop, predictor_from_dict
from steps.scaling.law import LawFit
from steps.scaling.prediction import (
    PREDICTION_FILE,
    Curve,
    LossPrediction,
    PredictionWatch,
    predicted_by,
    resolve_curve,
)
from steps.training.metrics_file import read_events, read_metrics
from tests.steps.tiny import seed, train

ROOT = Path(__file__).resolve().parents[3]
LAW = LawFit.of("chinchilla", E=1.6, A=400.0, alpha=0.45, B=1500.0, beta=0.4)
STEPS, BATCH, SEQ = 100, 8, 64  # tests.steps.tiny.train's run
TOKENS = STEPS * BATCH * SEQ


def write_grid(
    where: Path, law: LawFit = LAW, sizes=(16, 24, 32), budgets=(2e4, 5e4, 1e5)
) -> list[ScalingPoint]:
    """Evaluations of a ladder of tiny models, as evaluate writes them, with losses from `law`."""
    rng = np.random.default_rng(0)
    points = []
    for h in sizes:
        for tokens in budgets:
            loss = float(law.predict(active_non_embedding_params(tiny_moe(h)), tokens)) * math.exp(
                rng.normal(0, 0.005)
            )
            directory = where / f"eval-d{h}-{int(tokens)}"
            directory.mkdir(parents=True)
            (directory / "results.json").write_text(
                json.dumps({"average": {"loss": loss}, "validation_sets": {}})
            )
            points.append(ScalingPoint(f"d{h}-{int(tokens)}", tiny_moe(h), int(tokens), str(directory)))
    return points


def fit_step(points: list[ScalingPoint], model=TINY_MOE, tokens: int = TOKENS):
    return scaling_fit_step(
        "scaling/ladder", points=points, target=ScalingPoint("tiny", model, tokens), resamples=20
    )


# -- declaration -------------------------------------------------------------------------------------


def test_a_prediction_for_another_model_size_is_refused_naming_the_field(tmp_path):
    fit = fit_step(write_grid(tmp_path), model=tiny_moe(128))
    with pytest.raises(StepDeclarationError) as e:
        train(prediction=predicted_by(fit))
    message = str(e.value)
    assert message.startswith("step 'train/tiny', field `prediction`: 'scaling/ladder' predicts 'tiny'")
    assert "not this training" in message
    # The same model for other tokens is another prediction too.
    with pytest.raises(StepDeclarationError, match="field `prediction`"):
        train(prediction=predicted_by(fit_step(write_grid(tmp_path / "b"), tokens=2 * TOKENS)))


@pytest.mark.parametrize(
    ("prediction", "field", "words"),
    [
        (LossPrediction(points=((10, 3.0, 2.5, 3.5), (5, 2.0, 1.5, 2.5))), "prediction.points.1", "after 10"),
        (LossPrediction(points=((10, 3.0, 3.2, 3.5),)), "prediction.points.0", "low <= loss <= high"),
        (LossPrediction(points=((10, math.nan, 2.5, 3.5),)), "prediction.points.0", "positive finite"),
        (LossPrediction(points=((STEPS + 1, 3.0, 2.5, 3.5),)), "prediction.points.0", "at most num_steps"),
        (LossPrediction(points=((10, 3.0, 2.5, 3.5),), patience=0), "prediction.patience", ">= 1"),
        (LossPrediction(), "prediction", "either points or a fit"),
        ((10, 3.0), "prediction", "must be a LossPrediction"),
    ],
)
def test_bad_numbers_are_refused_naming_the_field(prediction, field, words):
    with pytest.raises(StepDeclarationError) as e:
        train(prediction=prediction)
    assert f"field `{field}`" in str(e.value) and words in str(e.value)


def test_the_prediction_stays_out_of_the_trainings_identity(tmp_path):
    def label(**options) -> str:
        dag = build_dag([train(**options)], "/prefix")
        return next(label for label, node in dag.nodes.items() if node.name == "train/tiny")

    fit = fit_step(write_grid(tmp_path / "a"))
    other = scaling_fit_step(
        "scaling/ladder",
        points=write_grid(
            tmp_path / "b", law=LawFit.of("chinchilla", E=1.0, A=300.0, alpha=0.4, B=900.0, beta=0.35)
        ),
        target=ScalingPoint("tiny", TINY_MOE, TOKENS),
    )
    plain = label()
    assert label(prediction=predicted_by(fit)) == label(prediction=predicted_by(other)) == plain
    assert label(prediction=LossPrediction(points=((50, 3.0, 2.5, 3.5),))) == plain
    # ...but the training waits for the fit.
    dag = build_dag([train(prediction=predicted_by(fit))], "/prefix")
    node = next(n for n in dag.nodes.values() if n.name == "train/tiny")
    assert any(dag.nodes[d].name == "scaling/ladder" for d in node.deps)


# -- the curve ---------------------------------------------------------------------------------------


def test_the_curve_from_a_fit_ends_at_its_prediction_with_its_interval(tmp_path):
    points = write_grid(tmp_path)
    fit = fit_step(points)
    config = ScalingFitConfig(
        points=points,
        target=ScalingPoint("tiny", TINY_MOE, TOKENS),
        output=str(tmp_path / "fit"),
        resamples=20,
    )
    result = scaling_fit(config)
    prediction = LossPrediction(fit=str(tmp_path / "fit"), patience=2, source=fit.name)
    curve = resolve_curve(
        prediction, model=TINY_MOE, tokens_per_step=BATCH * SEQ, num_steps=STEPS, eval_steps=[25, 50, 75, 100]
    )
    target = result["target"]
    step, loss, low, high = curve.final
    assert step == STEPS and loss == pytest.approx(target["predicted_loss"], rel=1e-9)
    assert (low, high) == pytest.approx((target["interval"]["low"], target["interval"]["high"]), rel=1e-9)
    assert curve.source == f"{target['method']} fit of scaling/ladder" and curve.patience == 2
    steps = [p[0] for p in curve.points]
    assert {50, 75, 100} <= set(steps) and steps == sorted(steps)
    # It starts where the training has seen the grid's smallest D (2e4 tokens: step 40 of 512
    # tokens), not at the law's extrapolation to a handful of tokens (25 is before it).
    assert steps[0] == math.ceil(2e4 / (BATCH * SEQ)) == 40 and 25 not in steps
    losses = [p[1] for p in curve.points]
    assert all(a > b for a, b in itertools.pairwise(losses)), "more tokens, lower loss"
    # The band is the target's interval, as a ratio, at every step.
    for _s, value, lo, hi in curve.points:
        assert lo / value == pytest.approx(low / loss) and hi / value == pytest.approx(high / loss)
    # The law at a step's tokens, scaled to end at the fit's prediction (the chosen method's law).
    n = active_non_embedding_params(TINY_MOE)
    if target["method"] == "chinchilla":
        law = LawFit.of("chinchilla", **result["methods"]["chinchilla"]["parameters"])
        assert curve.at(50)[0] == pytest.approx(law.predict(n, 50 * BATCH * SEQ), rel=1e-6)
    # Between points: log-linear, between its neighbours; outside the curve: nothing.
    a, b = curve.at(steps[0]), curve.at(steps[1])
    between = curve.at((steps[0] + steps[1]) / 2)
    assert b[0] < between[0] < a[0]
    assert curve.at(0) is None and curve.at(STEPS + 1) is None
    assert Curve.from_json(json.loads(json.dumps(curve.to_json()))) == curve


def test_a_fit_that_has_not_run_or_predicts_another_size_is_an_error(tmp_path):
    from steps.scaling.prediction import PredictionError

    prediction = LossPrediction(fit=str(tmp_path / "fit"))
    with pytest.raises(PredictionError, match=r"has no fit\.json"):
        resolve_curve(prediction, model=TINY_MOE, tokens_per_step=BATCH * SEQ, num_steps=STEPS)
    points = write_grid(tmp_path / "grid")
    scaling_fit(
        ScalingFitConfig(
            points=points,
            target=ScalingPoint("t", tiny_moe(128), TOKENS),
            output=str(tmp_path / "fit"),
            resamples=20,
        )
    )
    with pytest.raises(PredictionError, match="not this training"):
        resolve_curve(prediction, model=TINY_MOE, tokens_per_step=BATCH * SEQ, num_steps=STEPS)


def test_the_isoflop_predictor_read_back_from_fit_json_is_the_fits():
    n, d = np.meshgrid(np.geomspace(1e4, 1e6, 5), np.geomspace(1e5, 1e7, 5))
    n, d = n.ravel(), d.ravel()
    keep = (6 * n * d > 1e10) & (6 * n * d < 1e13)
    fit = fit_isoflop(n[keep], d[keep], LAW.predict(n[keep], d[keep]))
    predict = predictor_from_dict(json.loads(json.dumps(fit.as_dict())))
    for x, y in ((3e5, 2e6), (1e6, 1e7), (2e4, 5e5)):
        assert predict(x, y) == pytest.approx(fit.predict(x, y), rel=1e-9)


# -- the watch ---------------------------------------------------------------------------------------


def test_patience_evaluations_in_a_row_outside_warn_once_per_excursion():
    curve = Curve(((10, 3.0, 2.8, 3.2), (20, 2.5, 2.3, 2.7), (40, 2.0, 1.8, 2.2)), "given", 2)
    watch = PredictionWatch(curve)
    assert watch.observe(10, 3.1) is None and watch.latest["outside"] == 0
    assert watch.observe(20, 2.9) is None and watch.latest["outside"] == 1
    warning = watch.observe(30, 2.7)  # predicted at 30: sqrt(2.5 * 2.0), band [2.03, 2.46]
    assert warning is not None and watch.excursions == 1
    assert warning.startswith("eval loss 2.7000 at step 30 is ") and "above the predicted 2.2361" in warning
    assert "2 evaluations in a row outside the interval" in warning
    assert watch.observe(35, 2.6) is None and watch.excursions == 1  # still outside: said already
    assert watch.observe(40, 2.0) is None and watch.latest["outside"] == 0  # back inside
    assert watch.observe(40, 1.0) is None
    assert "below" in watch.observe(40, 1.0) and watch.excursions == 2
    assert watch.observe(41, 9.0) is None and watch.observe(5, 9.0) is None  # outside the curve: no verdict
    # A resumed attempt catches up without warning again.
    again = PredictionWatch(curve)
    again.replay([(10, 3.1), (20, 2.9), (30, 2.7)])
    assert again.excursions == 1 and again.latest["outside"] == 2


def test_status_says_on_prediction_or_how_far_off():
    report = {"done": 30, "total": 40, "unit": "steps", "time": 100.0}
    on = {"step": 30, "measured": 2.3, "predicted": 2.24, "low": 2.03, "high": 2.46, "outside": 0}
    assert (
        prediction_text(live_figures({**report, "data": {"prediction": on}}, 100.0)["prediction"])
        == "on prediction"
    )
    above = {**on, "measured": 2.7, "outside": 3}
    text = prediction_text(live_figures({**report, "data": {"prediction": above}}, 100.0)["prediction"])
    assert text == "eval 20.5% above prediction (3 evals outside)"
    below = {**on, "measured": 1.9, "outside": 1}
    assert prediction_text(live_figures({**report, "data": {"prediction": below}}, 100.0)["prediction"]) == (
        "eval 15.2% below prediction"
    )
    for garbage in ({**on, "predicted": "x"}, {**on, "low": math.inf}, [1, 2], "on"):
        assert "prediction" not in live_figures({**report, "data": {"prediction": garbage}}, 100.0)


# -- a real training, watched --------------------------------------------------------------------------

EXPERIMENT = """
import json
from pipeline import executor_main
from steps.scaling.prediction import predicted_by
from steps.scaling.fit import ScalingPoint, scaling_fit_step
from steps.models import TINY_MOE, tiny_moe
from steps.training.train_moe import OptimizerSpec
from tests.steps.tiny import mix, train

points = [ScalingPoint(p["label"], tiny_moe(p["hidden"]), p["tokens"], p["evaluation"])
          for p in json.loads({points!r})]
ladder = scaling_fit_step("scaling/ladder", points=points, target=ScalingPoint("tiny", TINY_MOE, 40 * 8 * 64),
                          resamples=20)
data = mix("mixture/predicted", steps=40)
training = train(OptimizerSpec(learning_rate=3e-3), "train/predicted", data=data, num_steps=40,
                 eval_interval=5, max_eval_batches=1, checkpoint_interval=40,
                 router_stats_interval=0, hf_export=False, prediction=predicted_by(ladder, patience=2))
if __name__ == "__main__":
    executor_main([training])
"""


@pytest.mark.slow
def test_a_training_off_its_prediction_warns_alerts_and_shows_it(tmp_path, webhook):
    # A ladder whose law promises far lower losses than a 40-step tiny model reaches.
    optimistic = LawFit.of("chinchilla", E=0.3, A=40.0, alpha=0.45, B=15.0, beta=0.4)
    points = write_grid(tmp_path / "ladder", law=optimistic, budgets=(4e3, 1e4, 2e4))
    described = [
        {"label": p.label, "hidden": p.model.hidden_dim, "tokens": p.tokens, "evaluation": p.evaluation}
        for p in points
    ]
    experiment = tmp_path / "predicted.py"
    experiment.write_text(EXPERIMENT.format(root=str(ROOT), points=json.dumps(described)))
    prefix = tmp_path / "prefix"
    seed(prefix)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    url, received = webhook

    def drydock(command: str, *options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pipeline", command, str(experiment), "--prefix", str(prefix), *options],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    before = drydock("plan")
    assert before.returncode == 0, before.stderr
    assert "predicted eval loss: from scaling/ladder, once it has run" in before.stdout
    result = drydock("run", "--backend", "local", "--notify", url)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = prefix.glob("train/predicted-*")
    fit = json.loads(next(prefix.glob("scaling/ladder-*")).joinpath("fit.json").read_text())["target"]
    curve = json.loads((run / PREDICTION_FILE).read_text())
    assert curve["final"]["loss"] == pytest.approx(fit["predicted_loss"])
    assert curve["source"] == f"{fit['method']} fit of scaling/ladder"
    # Every evaluation was far above the band: the second in a row made one warning, one event
    # line, one alert; the later ones, still outside, none. The curve starts where the training has
    # seen the grid's smallest D (4e3 tokens), so the evaluation at step 5 is not compared: the
    # second in a row is at step 15.
    assert curve["points"][0][0] == math.ceil(4e3 / (8 * 64)) == 8
    events = [e for e in read_events(str(run / "metrics.jsonl")) if e["event"] == "off_prediction"]
    assert len(events) == 1 and events[0]["step"] == 15 and events[0]["loss"] > events[0]["high"]
    status = (run / ".status").read_text()
    assert "above the predicted" in status and "2 evaluations in a row outside the interval" in status
    kinds = [m["body"]["drydock"]["kind"] for m in received]
    assert kinds == ["off_prediction", "finished"], received
    assert "eval loss" in received[0]["body"]["text"] and "above the predicted" in received[0]["body"]["text"]
    # The plan now shows the predicted final loss, offline; status says how far off the run is.
    after = drydock("plan")
    assert f"predicted eval loss: {fit['predicted_loss']:.4f}, 90% interval" in after.stdout
    assert f"at the end ({fit['method']} fit of scaling/ladder)" in after.stdout
    shown = drydock("status")
    assert shown.returncode == 0, shown.stderr
    assert "above prediction (" in shown.stdout and "evals outside)" in shown.stdout
    # Status speaks of the last evaluation, as the run page does (it spoke of the one before the
    # final one, logged after the last progress report).
    evaluated = [r["step"] for r in read_metrics(str(run / "metrics.jsonl")) if "eval/loss" in r]
    report = json.loads((run / ".progress").read_text())
    assert report["data"]["prediction"]["step"] == evaluated[-1], (report["data"]["prediction"], evaluated)
