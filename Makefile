# The two commands: `make serve` and `make test` (each sets up what is missing first).
.PHONY: setup serve test unit integration stub

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

# Optional: replace the wheel's Python stub with one built from the pinned python_backend
# sources, with the BLS deadlock fixed (docs/known-limits.md). Needs GitHub access, cmake,
# a C++17 compiler and Boost + rapidjson headers; `build_scripts/build_stub.py restore` undoes it.
# ARGS="--pins main --backend --cmake ... --patchelf ..." builds python_backend main and libtriton_python.so.
stub: setup
	@$(PY) -m build_scripts.build_stub all $(ARGS)
	@$(PY) -m build_scripts.stub_smoke
