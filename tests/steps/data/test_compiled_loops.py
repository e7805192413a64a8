"""The compiled curation kernels (`steps.data.compiled_loops`) on an install nobody may write to."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

DEDUPE = """
import json, sys
from steps.data.dedupe import DedupeConfig, dedupe
from steps.data import compiled_loops
dedupe(DedupeConfig(inputs=[sys.argv[1]], output=sys.argv[2], minhash="one_permutation"))
print(json.dumps(compiled_loops.CACHED))
"""


def _without_root_overrides() -> None:
    """In the child before exec: as root, drop the capabilities that let root write where the
    permissions say no (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER) from the bounding set."""
    if os.getuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _read_only(path: Path) -> None:
    for where, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chmod(os.path.join(where, name), 0o555 if name in dirs else 0o444)
    os.chmod(path, 0o555)


def test_a_read_only_install_dedupes_compiling_without_a_cache(tmp_path):
    """Regression: numba's `cache=True` raised "cannot cache function 'collapse_ascii': no locator
    available" where neither `__pycache__` beside the kernels nor the user's cache directory is
    writable (a hardened container). As root the step runs without root's permission overrides."""
    root = tmp_path
    try:
        shutil.copytree(ROOT / "steps", root / "steps", ignore=shutil.ignore_patterns("__pycache__"))
        (root / "home").mkdir()
        data = root / "data"
        data.mkdir()
        docs = ["the same words here and there", "the same words here and there", "something else"]
        (data / "s.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
        out = root / "out"
        out.mkdir()
        for path in (root / "steps", root / "home", data):
            _read_only(path)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
        env.update(PYTHONPATH=f"{root}:{ROOT}", HOME=str(root / "home"), XDG_CACHE_HOME=str(root / "home"))

        result = subprocess.run(
            [sys.executable, "-c", DEDUPE, str(data), str(out / "deduped")],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=_without_root_overrides,
        )
        assert result.returncode == 0, result.stderr
        cached = json.loads(result.stdout.strip().splitlines()[-1])
        assert cached and not any(cached.values()), cached
        assert "numba has no writable cache for" in result.stderr
        stats = json.loads((out / "deduped" / "stats.json").read_text())
        assert stats["total"]["documents_out"] == 2
    finally:  # pytest removes tmp_path; let it
        for where, dirs, _files in os.walk(root):
            for name in dirs:
                os.chmod(os.path.join(where, name), 0o755)
