"""The mixture step: epochs arithmetic against hand-computed numbers, errors, and a Levanter
`LmDataConfig` built from its output that really yields batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steps.data.mixture import (
    MixtureConfig,
    MixtureError,
    format_mixture,
    load_data_config,
    mixture,
    plan_mixture,
)
from steps.data.tokenize import TokenizeConfig, tokenize
from tests.steps.conftest import make_docs, write_jsonl

TOKENS = {"a": 10_000, "b": 4_000, "c": 2_000}
SCHEDULE = [(0, {"a": 1, "b": 1}), (30, {"a": 3, "b": 1}), (80, {"c": 1, "a": 1})]


def test_three_phase_schedule_arithmetic_by_hand():
    # 4 sequences x 16 tokens = 64 tokens per step; 6,400 tokens = 100 steps.
    plan = plan_mixture(SCHEDULE, TOKENS, target_tokens=6_400, batch_size=4, seq_len=16)
    assert plan.num_steps == 100
    assert [(p.start_step, p.end_step, p.tokens) for p in plan.phases] == [
        (0, 30, 1920),
        (30, 80, 3200),
        (80, 100, 1280),
    ]
    # phase 0: a 960, b 960; phase 1: a 2400, b 800; phase 2: c 640, a 640
    assert plan.tokens == {"a": 4000, "b": 1760, "c": 640}
    assert plan.epochs == {"a": pytest.approx(0.4), "b": pytest.approx(0.44), "c": pytest.approx(0.32)}
    assert plan.phases[1].weights == {"a": 0.75, "b": 0.25, "c": 0.0}
    # Phase starts as example offsets (30*4=120, 80*4=320) must be multiples of the block size.
    assert plan.block_size == 8
    assert plan.validation_only == []


def test_a_partial_last_step_counts_only_the_budget():
    plan = plan_mixture(SCHEDULE, TOKENS, target_tokens=6_410, batch_size=4, seq_len=16)
    assert plan.num_steps == 101
    assert plan.phases[-1].tokens == 6_410 - 80 * 64


def test_max_epochs_names_the_component():
    with pytest.raises(
        MixtureError, match=r"component 'b' would be read 0.44 times \(1,760 tokens of its 4,000\)"
    ):
        plan_mixture(SCHEDULE, TOKENS, target_tokens=6_400, batch_size=4, seq_len=16, max_epochs=0.42)


def test_zero_weight_everywhere_is_validation_only():
    plan = plan_mixture({"a": 1, "b": 0}, {"a": 100, "b": 50}, target_tokens=64, batch_size=1, seq_len=16)
    assert plan.validation_only == ["b"] and plan.epochs["b"] == 0


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([(5, {"a": 1})], "first phase must start at step 0"),
        ([(0, {"a": 1}), (0, {"b": 1})], "phase start steps must increase"),
        ([(0, {"a": 1}), (500, {"b": 1})], "a phase starts at step 500, but training has only 100 steps"),
        ({"zzz": 1}, r"phase 0 names unknown component\(s\) \['zzz'\]"),
        ({"a": 0, "b": 0}, "phase 0 \\(from step 0\\) has no positive weight"),
        ({"a": -1, "b": 2}, r"phase 0 gives negative weight to \['a'\]"),
    ],
)
def test_bad_weights(weights, message):
    with pytest.raises(MixtureError, match=message):
        plan_mixture(weights, TOKENS, target_tokens=6_400, batch_size=4, seq_len=16)


def tokenized(tmp_path: Path, tokenizer_dir: str, name: str, n: int, validation: bool) -> str:
    train = write_jsonl(tmp_path / "raw" / name / "train.jsonl", make_docs(n, seed=len(name)))
    val = [write_jsonl(tmp_path / "raw" / name / "val.jsonl", make_docs(20, seed=99))] if validation else []
    out = tmp_path / "tok" / name
    tokenize(
        TokenizeConfig(
            train=[str(train)], validation=[str(v) for v in val], tokenizer=tokenizer_dir, output=str(out)
        )
    )
    return str(out)


def test_mixture_output_is_a_levanter_config_that_yields_batches(tmp_path, tokenizer_dir):
    import haliax as hax
    import jax
    import numpy as np
    from levanter.schedule import BatchSchedule

    comps = {
        "prose": tokenized(tmp_path, tokenizer_dir, "prose", 300, validation=True),
        "code": tokenized(tmp_path, tokenizer_dir, "code", 200, validation=False),
        "heldout": tokenized(tmp_path, tokenizer_dir, "heldout", 50, validation=True),
    }
    cfg = MixtureConfig(
        components=comps,
        weights=[(0, {"prose": 1.0, "code": 1.0}), (8, {"prose": 3.0, "code": 1.0})],
        target_tokens=16 * 4 * 32,
        batch_size=4,
        seq_len=32,
        validation=["prose", "heldout"],
        max_epochs=10,
        output=str(tmp_path / "mix"),
    )
    mixture(cfg)
    table = json.loads((tmp_path / "mix" / "mixture.json").read_text())
    assert table["num_train_steps"] == 16
    assert table["components"]["heldout"]["validation_only"] is True
    assert [p["start_step"] for p in table["phases"]] == [0, 8]
    data = load_data_config(str(tmp_path / "mix"))
    assert data.train_weights == [
        (0, {"code": 0.5, "heldout": 0.0, "prose": 0.5}),
        (8, {"code": 0.25, "heldout": 0.0, "prose": 0.75}),
    ]
    Pos = hax.Axis("position", 32)
    train = data.train_set(Pos, BatchSchedule(4), key=jax.random.PRNGKey(0)).as_sync_dataset()
    batch = train.get_batch(list(range(8)))
    tokens = np.asarray(batch[0].tokens.array)
    assert tokens.shape == (32,) and tokens.max() < 400
    assert sorted(data.validation_sets(Pos)) == ["heldout", "prose"]


def test_mixture_errors_name_the_component(tmp_path, tokenizer_dir):
    prose = tokenized(tmp_path, tokenizer_dir, "prose", 50, validation=False)
    base = dict(
        components={"prose": prose},
        weights={"prose": 1.0},
        target_tokens=1000,
        batch_size=1,
        seq_len=10,
        output=str(tmp_path / "mix"),
    )
    with pytest.raises(MixtureError, match="validation: component 'prose' was tokenized without validation"):
        mixture(MixtureConfig(**base, validation=["prose"]))
    with pytest.raises(MixtureError, match=r"component 'ghost': no stats\.json"):
        mixture(MixtureConfig(**{**base, "components": {"prose": prose, "ghost": str(tmp_path / "nope")}}))
    with pytest.raises(MixtureError, match="would be read"):
        mixture(MixtureConfig(**{**base, "target_tokens": 10**7}, max_epochs=1))
    assert not (tmp_path / "mix").exists()


def test_a_training_given_as_a_component_is_refused_at_declaration():
    """A mixture component is tokenized data; a training's output writes none (it failed only when
    the mixture ran). A tokenize step, a path, or a step of one's own are taken."""
    from pipeline import Step, StepDeclarationError, this_output
    from steps.data.mixture import mixture_step
    from tests.pipeline.stepfns import WriteConfig, write_value
    from tests.steps.tiny import declared_training

    own = Step("data/own-cache", write_value, WriteConfig(this_output()))
    kwargs = {"weights": {"a": 1.0, "b": 1.0}, "target_tokens": 1024, "batch_size": 8, "seq_len": 128}
    with pytest.raises(StepDeclarationError) as err:
        mixture_step("mixture/x", components={"a": declared_training(), "b": "/data/tokenized/b"}, **kwargs)
    assert str(err.value).startswith("step 'mixture/x', field `components['a']`: ")
    assert "is a train_moe step, not tokenized data" in str(err.value)
    assert mixture_step("mixture/x", components={"a": own, "b": "/data/tokenized/b"}, **kwargs)


def test_the_preview_keeps_columns_apart_at_any_size():
    """Regression: fixed-width columns ran together at hero sizes (`0.500524,288,000,000`)."""
    tokens = {"code": 2_087_162_251_196, "web": 9_999_999_999_999}
    plan = plan_mixture(
        [(0, {"code": 0.5, "web": 0.5}), (100_000, {"code": 0.2, "web": 0.8})],
        tokens,
        target_tokens=1_048_576_000_000,
        batch_size=2048,
        seq_len=4096,
    )
    lines = format_mixture(plan, tokens).splitlines()
    header, *rows = lines[1:]
    phases = [f"{p.start_step}-{p.end_step}" for p in plan.phases]
    assert header.split() == [
        "component",
        "steps",
        phases[0],
        "steps",
        phases[1],
        "tokens",
        "available",
        "epochs",
    ]
    for name, row in zip(("code", "web"), rows, strict=True):
        cells = row.split()
        assert cells[0] == name and len(cells) == 6, row
        assert float(cells[1]) in (0.5, 0.2, 0.8) and int(cells[3].replace(",", "")) == plan.tokens[name]
        assert int(cells[4].replace(",", "")) == tokens[name]
        assert float(cells[5]) == round(plan.epochs[name], 2)
    assert len({len(line) for line in [header, *rows]}) == 1  # every column lined up
