# make demo / make test work on a fresh clone: both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.memscope-installed

.PHONY: install demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is the user's own: install the pinned CPU build only when the venv has none, and never
# let installing memscope replace it (torch is not among memscope's requirements).
$(STAMP): $(BIN)/python pyproject.toml tui/pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "torch==2.13.0" numpy
	$(BIN)/python -m pip install -q -e ".[test]" -e ./tui
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/memscope attach --headless --force --db demo.db examples/tiny_gpt.py --steps 30
	$(BIN)/memscope report demo.db

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) demo.db demo.db-wal demo.db-shm
