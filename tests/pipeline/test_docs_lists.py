"""Lists written for people that must follow the code: the architecture table covers every module
of the engine (and names only modules that exist), and the CLI's docs and usage text name every
command and every backend. Adding a command or a backend then fails here until its docs exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pipeline.cli import COMMANDS, usage
from pipeline.run.backends import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"


def table_paths() -> set[str]:
    """The paths in the module column of docs/architecture.md's table, relative to pipeline/."""
    paths = set()
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = line.split("|")
        if line.startswith("| ") and len(cells) >= 4:
            for path in re.findall(r"`([^`]+\.py|[^`]+/)`", cells[2]):
                paths.add(path.removeprefix("pipeline/"))
    return paths


def test_the_architecture_table_covers_every_module_and_only_real_ones():
    listed = table_paths()
    assert listed, "no table found in docs/architecture.md"
    modules = [p.relative_to(PIPELINE).as_posix() for p in PIPELINE.rglob("*.py")]

    def covered(module: str) -> bool:
        return any(module == p or (p.endswith("/") and module.startswith(p)) for p in listed)

    # A subpackage's empty __init__ has no job of its own.
    empty = {m for m in modules if m.endswith("__init__.py") and not (PIPELINE / m).read_text().strip()}
    assert sorted(m for m in modules if m not in empty and not covered(m)) == []
    assert sorted(p for p in listed if not (PIPELINE / p).exists()) == []


def test_every_command_is_in_the_docs_and_the_module_docstring():
    reference = (ROOT / "docs" / "cli.md").read_text()
    docstring = ast.get_docstring(ast.parse((PIPELINE / "cli" / "__init__.py").read_text())) or ""
    for command in COMMANDS:
        assert f"drydock {command.name}" in reference, f"docs/cli.md does not list `drydock {command.name}`"
        assert f"drydock {command.name}" in docstring, f"pipeline/cli's docstring lacks {command.name}"
        assert command.usage in usage()


def test_every_backend_is_in_the_usage_text_and_the_docs():
    reference = (ROOT / "docs" / "cli.md").read_text()
    (row,) = [line for line in reference.splitlines() if line.startswith("| `--backend")]
    assert f"--backend {'|'.join(REGISTRY)}" in usage()
    for name in REGISTRY:
        assert f"`{name}`" in row, f"docs/cli.md's --backend row does not describe `{name}`"
