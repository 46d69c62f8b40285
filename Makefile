# The two commands: `make serve` and `make test` (each sets up what is missing first).
.PHONY: setup serve test unit integration

PY := .venv/bin/python

setup:
	@build_scripts/setup.sh

serve: setup
	@$(PY) -m build_scripts.serve $(ARGS)

test: setup
	@$(PY) -m pytest tests $(ARGS)

unit: setup
	@$(PY) -m pytest tests/unit $(ARGS)

integration: setup
	@$(PY) -m pytest tests/integration $(ARGS)
