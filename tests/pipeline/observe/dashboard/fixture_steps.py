"""Step functions for the dashboard's tests: a tiny "train" and "evaluate" that write their files in
the real formats of the step library (train_moe's metrics.jsonl, evaluate's results.json) in
milliseconds, so the dashboard is tested on a prefix made by a real run of the executor.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

from pipeline import step_function
from pipeline.run.in_step import step_events
from pipeline.run.in_step.pulse import pulse
from pipeline.steplib import EVIDENCE_DIR, KEPT_DIR, evidence_line
from steps.scaling.prediction import Curve


@dataclass(frozen=True)
class CorpusConfig:
    output: str
    documents: int = 3


REMOVED = [
    # (reason, text, score, detail): what a curation step's evidence holds, in its format
    ("too_short", "<script>alert('x')</script> hi", 4.0, {"threshold": 50}),
    (
        "duplicate",
        "document 0",
        1.0,
        {"duplicate_of": {"file": "docs.jsonl", "index": 0, "excerpt": "DOC 0"}},
    ),
    ("language", "\x1b[31mrot\x1b[0m ist eine Farbe", 0.99, {"language": "de"}),
    ("too_short", "ok", 1.0, {"threshold": 50}),
]


@step_function
def write_corpus(config: CorpusConfig) -> None:
    """The corpus, as a curation step would leave it: the documents kept, and the evidence of
    the ones it removed and of those it kept (`pipeline.observe.evidence`)."""
    os.makedirs(config.output, exist_ok=True)
    kept = [{"id": f"doc-{i}", "text": f"document {i}"} for i in range(config.documents)]
    with open(os.path.join(config.output, "docs.jsonl"), "w") as f:
        for record in kept:
            f.write(json.dumps(record) + "\n")
    os.makedirs(os.path.join(config.output, EVIDENCE_DIR), exist_ok=True)
    os.makedirs(os.path.join(config.output, KEPT_DIR), exist_ok=True)
    # Per input shard, named for it: the shard here is docs.jsonl.
    with open(os.path.join(config.output, EVIDENCE_DIR, "docs.jsonl.jsonl"), "w") as f:
        for index, (reason, text, score, detail) in enumerate(REMOVED, config.documents):
            line = evidence_line(index, {"id": f"doc-{index}"}, text, reason, score, detail)
            f.write(json.dumps(line) + "\n")
    with open(os.path.join(config.output, KEPT_DIR, "docs.jsonl.jsonl"), "w") as f:
        for index, record in enumerate(kept):
            f.write(json.dumps(evidence_line(index, record, record["text"], None)) + "\n")
    reasons: dict[str, dict[str, int]] = {}
    for reason, text, _score, _detail in REMOVED:
        into = reasons.setdefault(reason, {"documents": 0, "bytes": 0})
        into["documents"] += 1
        into["bytes"] += len(text.encode())
    total_in = len(kept) + len(REMOVED)
    with open(os.path.join(config.output, "stats.json"), "w") as f:
        total = {"documents_in": total_in, "documents_kept": len(kept), "reasons": reasons}
        json.dump({"total": total}, f)


@dataclass(frozen=True)
class TrainConfig:
    data: str
    output: str
    num_steps: int = 40
    learning_rate: float = 3e-3
    spike_at: int | None = 30


def loss_at(step: int) -> float:
    """The loss curve the tests expect: decaying, with a spike at `spike_at`."""
    return 6.0 * math.exp(-step / 12) + 1.5


def wall_time(step: int) -> float:
    """When step `step` ended: about a second a step, 0.1-0.2 s more on two steps in three, 1.5 s
    more after each evaluation."""
    return sum(1.0 + 0.1 * (s % 3) + (1.5 if s and s % 10 == 0 else 0.0) for s in range(step + 1))


def mfu_at(step: int) -> float:
    """MFU in percent: about 30, lower on the steps an evaluation slows."""
    return 30.0 - (6.0 if step and step % 10 == 0 else 0.0) + (step % 3) * 0.5


def predicted_at(step: int) -> float:
    """The prediction the tests give the training: a little above its eval losses, a 5% band."""
    return loss_at(step) + 0.15


def train_tiny(config: TrainConfig) -> None:
    """Writes metrics.jsonl as steps.training.tracker.JsonlTracker does while training runs: Levanter's
    long keys, and a step's metrics spread over several lines that readers merge; prediction.json
    as steps.scaling.prediction writes it; and keeps a pulse (pipeline.run.in_step.pulse) every 50 ms."""
    os.makedirs(config.output, exist_ok=True)
    context = step_events.current()
    assert context is not None, "the executor binds a step context around every step function"
    points = tuple((s, predicted_at(s), 0.95 * predicted_at(s), 1.05 * predicted_at(s)) for s in range(1, 41))
    with open(os.path.join(config.output, "prediction.json"), "w") as f:
        json.dump(Curve(points, "chinchilla fit of scaling/ladder", 3).to_json(), f)
    with pulse(context, every=0.05):
        _train_tiny(config, context)
        time.sleep(0.2)  # a few pulses


def _train_tiny(config: TrainConfig, context: step_events.StepContext) -> None:
    log_lines = []
    with open(os.path.join(config.output, "metrics.jsonl"), "w") as f:
        for step in range(config.num_steps):
            loss = loss_at(step) * (4.0 if step == config.spike_at else 1.0)
            lr = config.learning_rate * min(1.0, (step + 1) / 10)
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "train/loss": loss,
                        "optim/learning_rate": lr,
                        "wall_time": wall_time(step),
                    }
                )
                + "\n"
            )
            throughput = {"throughput/tokens_per_second": 1000.0 + step, "throughput/mfu": mfu_at(step)}
            f.write(json.dumps({"step": step, **throughput}) + "\n")
            if step % 5 == 0:  # router statistics: a skew the balancing bias evens out
                ratio = 1.0 + 2.0 / (1 + step)
                f.write(
                    json.dumps(
                        {
                            "step": step,
                            "router/max_load_ratio": ratio,
                            "router/mean_max_load_ratio": 1.0 + 1.0 / (1 + step),
                        }
                    )
                    + "\n"
                )
            if step and step % 10 == 0 and step < config.num_steps - 1:  # evaluations during training
                f.write(json.dumps({"step": step, "eval/loss": loss_at(step) + 0.2}) + "\n")
            log_lines.append(f"step {step}: loss {loss:.4f}")
            figures = {
                "loss": loss,
                "tokens_per_second": 1000.0 + step,
                "eta_seconds": config.num_steps - step - 1,
            }
            if step >= 10:
                latest = 10 * (step // 10)
                measured, predicted = loss_at(latest) + 0.2, predicted_at(latest)
                figures["prediction"] = {
                    "step": latest,
                    "measured": measured,
                    "predicted": predicted,
                    "low": 0.95 * predicted,
                    "high": 1.05 * predicted,
                    "outside": 0,
                }
            if config.spike_at is not None and step >= config.spike_at:
                figures["interventions"] = {"spike_steps": 1}
            step_events.progress(step + 1, config.num_steps, "steps", figures)
            if step == config.spike_at:
                f.write(
                    json.dumps({"event": "spike", "step": step, "loss": loss, "median": loss_at(step)}) + "\n"
                )
                step_events.warn(f"loss spike at step {step}: {loss:.4f}", {"step": step, "loss": loss})
    with open(os.path.join(config.output, "train_result.json"), "w") as f:
        json.dump({"steps": config.num_steps}, f)
    # Both backends keep a copy of each attempt's output in .logs/attempt-<token>.log.
    print("\n".join(log_lines) + "\ntrain_tiny: done", flush=True)


@dataclass(frozen=True)
class EvalConfig:
    train: str
    output: str


def evaluate_tiny(config: EvalConfig) -> None:
    """Writes results.json in steps.evaluation.evaluate's format."""
    with open(os.path.join(config.train, "train_result.json")) as f:
        last = json.load(f)["steps"] - 1
    sets = {}
    for name, offset in (("web", 0.1), ("code", 0.3)):
        loss = loss_at(last) + offset
        sets[name] = {"loss": loss, "bits_per_byte": loss / math.log(2) / 4, "perplexity": math.exp(loss)}
    average = {
        k: sum(s[k] for s in sets.values()) / len(sets) for k in ("loss", "bits_per_byte", "perplexity")
    }
    result = {
        "checkpoint": os.path.join(config.train, "checkpoints", f"step-{last}"),
        "checkpoint_step": last,
        "validation_sets": sets,
        "average": average,
        "seconds": 0.01,
    }
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "results.json"), "w") as f:
        json.dump(result, f, indent=2)


@dataclass(frozen=True)
class PredictedTrainConfig(TrainConfig):
    """A training compared with a fit it only consults (`output_of(fit, identity=False)`)."""

    fit: str | None = None


@dataclass(frozen=True)
class FitConfig:
    """A step reading many evaluations, with many fields of its own, and no metrics (a fit)."""

    evaluations: tuple[str, ...]
    output: str
    settings: tuple[int, ...] = (1, 2, 3)
    method: str = "chinchilla"


@step_function
def fit_tiny(config: FitConfig) -> None:
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "fit.json"), "w") as f:
        json.dump({"points": len(config.evaluations)}, f)


@step_function
def diverge(config: TrainConfig) -> None:
    raise FloatingPointError("loss became NaN at step 3")


@dataclass(frozen=True)
class ScoreConfig:
    train: str
    output: str


def score_report(config: ScoreConfig) -> dict:
    """A report the dashboard has never heard of: one table and one value."""
    with open(os.path.join(config.output, "scores.json")) as f:
        scores = json.load(f)
    rows = [{"task": name, "accuracy": value} for name, value in sorted(scores.items())]
    return {"tasks": rows, "tasks scored": len(rows)}


@step_function(report=score_report)
def score_tiny(config: ScoreConfig) -> None:
    """A new kind of step (task scores) with a declared report."""
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "scores.json"), "w") as f:
        json.dump({"arith": 0.75, "prose": 0.5}, f)


def train_metrics(config: TrainConfig) -> dict:
    """What `drydock compare` compares of a training: its final loss."""
    return {"train/loss": loss_at(config.num_steps - 1) * (1 + config.learning_rate)}


def eval_metrics(config: EvalConfig) -> dict:
    with open(os.path.join(config.output, "results.json")) as f:
        sets = json.load(f)["validation_sets"]
    return {f"eval/{name}/loss": values["loss"] for name, values in sets.items()}


def task_metrics(config: ScoreConfig) -> dict:
    with open(os.path.join(config.output, "scores.json")) as f:
        return {f"task/{name}/acc": value for name, value in json.load(f).items()}


# The compared kind of each: a training's row gets its evaluations' metrics (pipeline.observe.compare).
step_function(train_tiny, metrics=train_metrics)
step_function(evaluate_tiny, metrics=eval_metrics)
step_function(score_tiny, report=score_report, metrics=task_metrics)
