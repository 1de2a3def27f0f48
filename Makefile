# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
DEMO_OUT ?= out/demo-embeddings
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first, pinned, so the CPU wheel is taken and nothing pulls a CUDA build
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: install
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/shoal embed datasets/demo/ $(DEMO_OUT)/ --model minilm

test: install
	$(VENV)/bin/pytest -q

bench: install
	$(PY) benchmarks/batch_throughput.py

clean:
	rm -rf $(VENV) out .pytest_cache
