# Set-up and tests. `make test` creates .venv (Python 3.11), installs the pinned stack and runs
# pytest; a second call reuses what is done (the venv, and the cached mmcv wheel outside the repo).
# STACK=oldest does the same for the low end of the supported range (torch 2.1.2, numpy 1.26,
# requirements/oldest.txt) in .venv-oldest; CI runs both.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
STACK ?= pinned
ifeq ($(STACK),pinned)
VENV ?= .venv
STACK_REQS := requirements/runtime.txt requirements/tests.txt
else ifeq ($(STACK),oldest)
VENV ?= .venv-oldest
STACK_REQS := requirements/oldest.txt
else
$(error STACK must be 'pinned' (requirements/runtime.txt, tests.txt) or 'oldest' (requirements/oldest.txt), not '$(STACK)')
endif
# Both stacks' torch builds from PyPI are CUDA builds: with no GPU visible their mmcv gets CPU
# ops (.dev_scripts/build_mmcv_wheel.sh with POLA_MMCV_CPU_ONLY=1, unless that is set already)
MMCV_BUILD_ENV := $(if $(POLA_MMCV_CPU_ONLY),,$(shell nvidia-smi -L >/dev/null 2>&1 || echo POLA_MMCV_CPU_ONLY=1))
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.polaformer_mm-installed
PYTEST_ARGS ?=

.PHONY: install test test-fast quickstart clean-venv lint format

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11) and "the tested stack needs Python 3.11; set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) requirements/build.txt $(STACK_REQS) requirements/mim.txt requirements/deploy.txt setup.py
	$(PIP) install -r requirements/build.txt $$(grep -hE '^(torch|numpy)==' $(STACK_REQS))
	wheels=$$($(MMCV_BUILD_ENV) .dev_scripts/build_mmcv_wheel.sh $(PY)) && \
	  $(PIP) install --find-links "$$wheels" --only-binary mmcv \
	    $(addprefix -r ,$(STACK_REQS)) && \
	  $(PIP) install --no-deps -r requirements/mim.txt -r requirements/deploy.txt
	$(PY) -c "import torchvision, mmcv.ops, mmdet.models, mmseg.models, mmpretrain.models, mim, mmdeploy.apis, polaformer_mm; print('stack ok')" \
	  || { echo 'install: the stack does not import (see above)'; exit 1; }
	echo $(STACK) > $(VENV)/.polaformer_mm-stack
	touch $(STAMP)

# The package itself, installed as users install it (not editable: `mim search polaformer_mm`
# reads the model index from site-packages/polaformer_mm/.mim, which an editable install
# lacks). Reinstalled when a tracked file of the package, its configs or tools changes; the
# tests and tools run from the repository, which comes first on their sys.path.
PKG := $(VENV)/.polaformer_mm-package
PKG_FILES := setup.py model-index.yml $(shell git ls-files polaformer_mm configs tools 2>/dev/null)
$(PKG): $(STAMP) $(PKG_FILES)
	$(PIP) install --no-build-isolation --no-deps --force-reinstall .
	touch $(PKG)

install: $(STAMP) $(PKG)

# The one-iteration config trains (tests/_smoke.py: configs_to_train): the pinned stack trains
# the smallest size of each group of configs that differ only in the backbone size, the low
# end one config of each (detector or segmentor, backbone family) pair; both build every
# config. TRAINS=all trains every config.
TRAINS := $(if $(filter oldest,$(STACK)),one-per-pair,one-per-size-family)
# Tests in TEST_WORKERS processes (pytest-xdist), one torch thread each (tests/conftest.py):
# 2 for the 2-core machines of the budgets (docs/notes/developer_guide.md), 0 for one process
# (a debugger), auto for one per core.
TEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS))

test: install
	POLA_TEST_TRAINS=$(TRAINS) $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# the inner loop: the tests not marked slow (pytest.ini)
test-fast: install
	$(PY) -m pytest -m 'not slow' $(XDIST) $(PYTEST_ARGS)

# Style (OpenMMLab: flake8, isort, yapf; interrogate for docstring coverage), settings in
# setup.cfg; the same tools as .pre-commit-config.yaml. Needs only the venv and
# requirements/lint.txt, not the stack. `make format` rewrites files in place.
LINT_STAMP := $(VENV)/.polaformer_mm-lint
LINT_PATHS := polaformer_mm tools .dev_scripts tests configs setup.py
YAPF_EXCLUDE := --exclude 'polaformer_mm/.mim/**'
$(LINT_STAMP): $(PY) requirements/lint.txt
	$(PIP) install -r requirements/lint.txt
	touch $(LINT_STAMP)

lint: $(LINT_STAMP)
	$(VENV)/bin/flake8 $(LINT_PATHS)
	$(VENV)/bin/isort --check-only --diff $(LINT_PATHS)
	$(VENV)/bin/yapf --diff --recursive $(YAPF_EXCLUDE) $(LINT_PATHS)
	$(VENV)/bin/interrogate -c setup.cfg polaformer_mm
	$(VENV)/bin/vermin --target=3.9- --violations --eval-annotations --no-tips \
	  --exclude-regex '\.mim/' polaformer_mm tools .dev_scripts tests configs setup.py
	@echo 'lint ok'

format: $(LINT_STAMP)
	$(VENV)/bin/isort $(LINT_PATHS)
	$(VENV)/bin/yapf --in-place --recursive $(YAPF_EXCLUDE) $(LINT_PATHS)

# The main job on built-in data: synthetic data, train + evaluate Mask R-CNN and Semantic FPN
# with a small Pola-PVT from scratch, draw predictions. COMPARE=1 also trains the softmax
# counterpart (attn_types='SSSS') and prints both side by side.
QUICKSTART_ARGS ?=
COMPARE ?=
quickstart: install
	$(PY) tools/quickstart.py $(if $(filter-out 0,$(COMPARE)),--compare) $(QUICKSTART_ARGS)

# On a machine with a CUDA GPU: the CUDA tests, the backbone benchmark on CUDA and a short AMP
# training; one report folder (docs/advanced_guides/gpu_check.md). Without a GPU it says so
# and fails.
GPU_CHECK_ARGS ?=
.PHONY: gpu-check
gpu-check: install
	$(PY) tools/gpu_check.py $(GPU_CHECK_ARGS)

clean-venv:
	rm -rf $(VENV)
