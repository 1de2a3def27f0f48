# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
DEMO_OUT ?= out/demo-embeddings
GLINER := gliner==0.2.29
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: typecheck-tree install demo test test-fast lint bench tune bench-tuned bench-runtimes bench-defaults image clean

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first and pinned, so nothing later pulls another build; on this kind of
	# machine pip's configured local wheel directory supplies the CPU wheel
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test]'
	# GLiNER span extractors: gliner declares transformers<5.17 and runs on the newer one Shoal installs, so
	# it goes in without its dependencies (docs/DEPLOY.md, "Models")
	$(PIP) install --quiet --no-deps $(GLINER)
	touch $@

install: $(VENV)/.installed

demo: install
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/shoal embed datasets/demo/ $(DEMO_OUT)/ --model minilm

test: install
	$(VENV)/bin/pytest -q

# The unit tests only (tests/conftest.py, "Two tiers"): no cluster, model, S3 server or process; seconds.
test-fast: install
	$(VENV)/bin/pytest -q -m unit

# mypy reads the packages as the wheel lays them out (shoal/pipeline, shoal/workers, …), from links, because
# it cannot follow the editable install's import hook (pyproject.toml's package-dir).
typecheck-tree:
	rm -rf out/typecheck && mkdir -p out/typecheck/shoal
	ln -s ../../../shoal/__init__.py out/typecheck/shoal/__init__.py
	for p in pipeline workers scheduler_plugins configs; do ln -s ../../../$$p out/typecheck/shoal/$$p; done

# What CI checks besides the tests: ruff's lint and format, mypy on the library, tests/ and benchmarks/ (pyproject.toml).
lint: install typecheck-tree
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: install
	$(PY) benchmarks/batch_throughput.py

# Re-tune the shipped cpu-2core profile on this machine (run it on a quiet one), from the untuned default.
tune: install
	$(VENV)/bin/shoal tune --profile cpu-2core --models minilm --budget-minutes 10 --base cpu-local

# The tuned profile against the untuned default, in one run (docs/BENCHMARKS.md, "Tuned profile (issue 7)").
bench-tuned: install
	$(PY) benchmarks/batch_throughput.py --profile cpu-2core --json benchmarks/results/tuned_vs_default.json

# Runtimes and precision (docs/BENCHMARKS.md): per runtime/dtype, whole `shoal embed` against a direct fp32
# encode and fastembed (own venv under out/bench-runtimes, installed once), `shoal serve` at 32 clients.
bench-runtimes: install
	$(PY) benchmarks/runtimes.py

# Fast by default (docs/BENCHMARKS.md): whole no-flag commands against a direct fp32 encode, their stage
# timings, and `make demo`'s rows/s against the demo on cpu-local (the default before `auto`).
bench-defaults: install
	$(PY) benchmarks/defaults.py

# Shoal's CPU image, localhost/shoal:VERSION, built with podman on an mmdebstrap'd Debian base (cached); prints
# its size. docs/DEPLOY.md, "The image".
image:
	deploy/build-image.sh

clean:
	rm -rf $(VENV) out .pytest_cache
