"""The bad-input corpus: every experiment file in `cases/` is a mistake a user can make.

Each case runs through the real CLI (`python -m pipeline run CASE --prefix TMP --backend local`)
and must give exit code 2, exactly one line on stderr, starting `error:` and containing the
text its `# expect:` header names (the step, field or flag at fault), no traceback, and nothing
written: the prefix does not exist afterwards, or is empty.

A case file declares, in comments at its top:
    # expect: TEXT   a fragment of the one error line (naming the step, field or flag)
    # args: ARGS     extra command-line options; `{tmp}` is the test's temporary directory
                     (which holds a regular file `afile`, for prefixes that cannot be used)

All cases start at once from one fixture (a CLI start is about half a second) and each case
is then checked as its own test.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted((Path(__file__).parent / "cases").glob("*.py"))


@dataclass(frozen=True)
class Case:
    path: Path
    expect: str
    args: str

    @staticmethod
    def load(path: Path) -> Case:
        headers = {}
        for line in path.read_text().splitlines():
            if line.startswith("# ") and ":" in line:
                key, _, value = line[2:].partition(":")
                headers[key.strip()] = value.strip()
        assert headers.get("expect"), f"{path.name} has no `# expect:` header"
        return Case(path, headers["expect"], headers.get("args", ""))


@dataclass(frozen=True)
class Outcome:
    code: int
    stderr: str
    tmp: Path
    prefix: Path


def _run(case: Case, tmp: Path) -> Outcome:
    tmp.mkdir(parents=True)
    (tmp / "afile").write_text("a regular file, not a directory\n")
    prefix = tmp / "prefix"
    args = shlex.split(case.args.replace("{tmp}", str(tmp)))
    if "--prefix" not in args:
        args = ["--prefix", str(prefix), *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled")
    env.pop("DRYDOCK_PREFIX", None)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(case.path), "--backend", "local", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,  # a stray relative path would land here, where the test looks for it
        timeout=60,
    )
    return Outcome(result.returncode, result.stderr, tmp, prefix)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("bad_inputs")
    cases = [Case.load(p) for p in CASES]
    with ThreadPoolExecutor(4) as pool:
        results = pool.map(lambda c: _run(c, root / c.path.stem), cases)
        return {c.path.stem: r for c, r in zip(cases, results, strict=True)}


def test_the_corpus_has_at_least_25_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_bad_input_gives_one_clear_error_and_writes_nothing(path, outcomes):
    case = Case.load(path)
    outcome = outcomes[path.stem]
    assert "Traceback" not in outcome.stderr, outcome.stderr
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1, outcome.stderr
    assert lines[0].startswith("error: "), outcome.stderr
    assert case.expect in lines[0], f"expected {case.expect!r} in: {lines[0]}"
    assert outcome.code == 2, outcome.stderr
    assert not outcome.prefix.exists() or not any(outcome.prefix.iterdir()), sorted(outcome.prefix.rglob("*"))
    # Nothing else appeared in the working directory either (only the file the test made).
    assert sorted(p.name for p in outcome.tmp.iterdir()) in (["afile"], ["afile", "prefix"])
    assert (outcome.tmp / "afile").read_text().startswith("a regular file")


@pytest.mark.parametrize(
    "name",
    [
        "mixture_unknown_component",
        "train_longer_than_mixture",
        "tokenize_missing_tokenizer",
        # Regression: `plan` said nothing of a gang on the local backend, which `run` refuses.
        "resources_gang_on_local_backend",
    ],
)
def test_drydock_plan_shows_the_same_errors(name, tmp_path):
    """A step config mistake is found by `drydock plan` too, before anything runs (with the
    backend the run would use: `--backend local`, as the run of each case)."""
    case = Case.load(Path(__file__).parent / "cases" / f"{name}.py")
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled")
    command = [sys.executable, "-m", "pipeline", "plan", str(case.path), "--backend", "local"]
    result = subprocess.run(
        [*command, "--prefix", str(tmp_path / "prefix")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and case.expect in lines[0], result.stderr
    assert not (tmp_path / "prefix").exists()
