"""The registry of model families: the built-in ones are found by name, a new family is one
registered `ModelFamily` that every model check, count and Levanter config then goes through,
and what no family accepts is refused naming the field."""

from __future__ import annotations

import dataclasses

import pytest

import steps.models.config as config
from steps.models import ModelFamily, MoeModelConfig, family, family_names, parameter_counts, to_levanter
from steps.models.families import drydock_moe, mixtral, qwen3_moe


def test_the_built_in_families_register_themselves_when_the_package_is_imported():
    assert set(family_names()) >= {"qwen3_moe", "mixtral", "drydock_moe"}
    assert family("qwen3_moe") is qwen3_moe.QWEN3_MOE and family("mixtral") is mixtral.MIXTRAL
    assert family("drydock_moe") is drydock_moe.DRYDOCK_MOE
    # What the training code asks of a family instead of branching on its name.
    assert [family(n).levanter_export for n in ("qwen3_moe", "mixtral", "drydock_moe")] == [True, True, False]
    assert [family(n).logs_in_loss for n in ("qwen3_moe", "mixtral", "drydock_moe")] == [False, True, False]


@pytest.fixture
def registered():
    """A family registered for one test, then taken out of the registry again."""
    added: list[str] = []

    def register(kind: ModelFamily) -> ModelFamily:
        added.append(kind.name)
        return config.register(kind)

    yield register
    for name in added:
        config._FAMILIES.pop(name, None)


def test_a_new_family_is_one_registered_object(registered):
    seen: list[str] = []

    def check(model: MoeModelConfig) -> None:
        seen.append("check")
        if model.num_layers > 8:
            raise ValueError("model.num_layers: the toy family has at most 8")

    toy = registered(
        ModelFamily(
            name="toy",
            check=check,
            parameter_counts=lambda model, vocab: (model.hidden_dim * vocab, model.hidden_dim),
            to_levanter=lambda model, seq_len, tokenizer: ("toy", seq_len, tokenizer),
            own_fields=frozenset({"sliding_window"}),
        )
    )
    model = MoeModelConfig(family="toy", sliding_window=16)
    assert family("toy") is toy and "toy" in family_names()
    assert parameter_counts(model, 10) == (640, 64) and to_levanter(model, 32, "t") == ("toy", 32, "t")
    assert seen == ["check", "check"]
    with pytest.raises(ValueError, match="the toy family has at most 8"):
        dataclasses.replace(model, num_layers=9).check()
    # Its own fields are its own: another family refuses them, naming the families that have them.
    with pytest.raises(
        ValueError, match=r"model.global_every: only the drydock_moe family has it \(this is toy\)"
    ):
        dataclasses.replace(model, global_every=2).check()
    with pytest.raises(ValueError, match="only the drydock_moe and toy family has it"):
        MoeModelConfig(family="qwen3_moe", sliding_window=16).check()


def test_a_name_is_registered_once_and_an_unknown_name_lists_the_known_ones(registered):
    registered(
        ModelFamily("twice", check=lambda m: None, parameter_counts=lambda m, v: (0, 0), to_levanter=print)
    )
    with pytest.raises(ValueError, match="already registered"):
        config.register(
            ModelFamily(
                "twice", check=lambda m: None, parameter_counts=lambda m, v: (0, 0), to_levanter=print
            )
        )
    with pytest.raises(ValueError, match="own_fields"):
        config.register(
            ModelFamily(
                "odd",
                check=lambda m: None,
                parameter_counts=lambda m, v: (0, 0),
                to_levanter=print,
                own_fields=frozenset({"hidden_dim"}),
            )
        )
    with pytest.raises(ValueError, match=r"model.family: unknown 'gpt'; use one of .*'qwen3_moe'"):
        MoeModelConfig(family="gpt").check()
