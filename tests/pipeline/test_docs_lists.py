"""Lists written for people that must follow the code: the architecture tables cover every module
of the engine and of the step library (and name only modules that exist), and the CLI's docs and
usage text name every command and every backend. Adding a command, a backend or a step kind then
fails here until its docs exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline.cli import COMMANDS, usage
from pipeline.run.backends import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"
STEPS = ROOT / "steps"


def table_paths(package: str) -> set[str]:
    """The paths in the module column of docs/architecture.md's tables that name `package`'s
    modules, relative to it (the engine's table leaves out its `pipeline/`)."""
    paths = set()
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = line.split("|")
        if line.startswith("| ") and len(cells) >= 4:
            for path in re.findall(r"`([^`]+\.py|[^`]+/)`", cells[2]):
                if path.startswith("steps/") == (package == "steps"):
                    paths.add(path.removeprefix(f"{package}/"))
    return paths


@pytest.mark.parametrize("package", ["pipeline", "steps"])
def test_the_architecture_tables_cover_every_module_and_only_real_ones(package):
    root = ROOT / package
    listed = table_paths(package)
    assert listed, f"no table of {package}/ found in docs/architecture.md"
    modules = [p.relative_to(root).as_posix() for p in root.rglob("*.py")]

    def covered(module: str) -> bool:
        return any(module == p or (p.endswith("/") and module.startswith(p)) for p in listed)

    # A package's __init__ that says its job in a docstring, and nothing else, has no row.
    def only_a_docstring(module: str) -> bool:
        tree = ast.parse((root / module).read_text())
        return all(isinstance(node, ast.Expr) for node in tree.body)

    packages = {m for m in modules if m.endswith("__init__.py") and only_a_docstring(m)}
    # The step library's own __init__ (the folder index and old module paths) and scaling's say
    # their job in docs/architecture.md's prose around the table.
    packages |= {m for m in modules if package == "steps" and m in ("__init__.py", "scaling/__init__.py")}
    assert sorted(m for m in modules if m not in packages and not covered(m)) == []
    assert sorted(p for p in listed if not (root / p).exists()) == []


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
