# splitlab: two commands set everything up and run (README.md):
#   make demo   the main job on the shipped defaults (the catalog's current set, data/catalog.toml)
#   make test   ruff + the test suite (CPU only; kernels under Triton's interpreter)
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU-only machines must not resolve torch to a multi-GB CUDA build: install a CPU build first
# (here 2.13.0+cpu lies in pip's local wheel folder; elsewhere use PyTorch's CPU index, README.md).
TORCH ?= torch==2.13.0
# triton 3.6 (the GPU machine's version) needs numpy < 2.4 under the interpreter.
PINS ?= triton==3.6.0 numpy<2.4

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)" 2>&1 | grep -v 'is ignored' || true
	$(PY) -m pip install -q -e ".[test,lab,dist]" $(foreach p,$(PINS),"$(p)") 2>&1 | grep -v 'is ignored' || true
	$(PY) -c "import torch, triton, splitlab; assert torch.__version__ and splitlab"
	touch $@

.PHONY: setup test demo lint
setup: $(VENV)/.installed

# dist/splitlab-*.whl: the package with its kernel cards, notebooks, constants and the sets the default report reads
# inside (pyproject's package-dir and package-data);
# install-check installs such a wheel into a fresh folder and runs splitlab from outside the checkout (make test
# runs it too).
.PHONY: wheel install-check
wheel: setup
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .
install-check: setup
	$(PY) -m pytest tests/test_install.py

lint: setup
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest

demo: setup
	$(VENV)/bin/splitlab plan --workload deepseek-v3-mla --batch 8 --ctx 81920 --device mi355x,h200,rtx5090
	$(VENV)/bin/splitlab report --out reports

# JupyterLab opens notebooks/*.py as notebooks (the Jupytext Notebook viewer): the lab setting in
# .jupyter/labconfig/default_setting_overrides.json, read through JUPYTER_CONFIG_PATH (before any given);
# LAB_ARGS go to jupyter lab (e.g. LAB_ARGS="--no-browser --port 8899").
LAB_ARGS ?=
.PHONY: lab
lab: setup
	JUPYTER_CONFIG_PATH="$(CURDIR)/.jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" $(VENV)/bin/jupyter lab $(LAB_ARGS)
