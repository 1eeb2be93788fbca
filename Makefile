# make demo / make test work on a fresh clone: both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.memscope-installed
TSTAMP := $(VENV)/.memscope-test-installed

.PHONY: install demo test test-deps lint docs bench gpu-check clean bytecode

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is the user's own: install the pinned CPU build only when the venv has none, and never
# let installing memscope replace it (torch is not among memscope's requirements).
$(STAMP): $(BIN)/python pyproject.toml tui/pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "torch==2.13.0" numpy
	$(BIN)/python -m pip install -q -e ".[test]" -e ./tui
	$(COMPILE)
	touch $(STAMP)

# memscope's own modules compiled ahead (pip compiles what it installs, not an editable source):
# where PYTHONDONTWRITEBYTECODE=1 is set nothing else writes them, and every attached process
# compiled the agent and the CLI from source (0.06-0.15 s each; hundreds in the suite).
# Stale ones are harmless: Python checks each against its source's time.
COMPILE = $(BIN)/python -m compileall -q memscope tui/memscope_tui >/dev/null
bytecode: $(STAMP)
	@$(COMPILE)

install: $(STAMP)

# The integration tests drive the real Lightning and Hugging Face Trainer: installed for the tests
# only, with the venv's own torch pinned as a constraint so neither can replace it.
$(TSTAMP): $(STAMP)
	$(BIN)/python -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/torch-constraint.txt
	$(BIN)/python -m pip install -q -c $(VENV)/torch-constraint.txt -e ".[test,integrations]"
	touch $(TSTAMP)

demo: install
	$(BIN)/memscope attach --headless --force --db demo.db examples/tiny_gpt.py --steps 30
	$(BIN)/memscope report demo.db

# System tools the end-to-end tests drive: tmux (a real terminal for the dashboard) and headless
# Chromium (opens the HTML report). Installed from Debian's packages when missing; where that is
# not possible the tests that need them skip and say why.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
test-deps:
	@missing=""; \
	command -v tmux >/dev/null 2>&1 || missing="$$missing tmux"; \
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing from Debian's packages"; \
	    ($(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq$$missing >/dev/null) \
	      || echo "warning: could not install$$missing; the tests that need them will skip"; \
	  else echo "warning:$$missing not installed and no apt-get; the tests that need them will skip"; fi; \
	fi

# The suite on TEST_JOBS workers (pytest-xdist; auto: one per core). --dist loadfile keeps each
# test file on one worker, so a module's shared real runs (module-scoped fixtures) are made once.
# TEST_JOBS=0 runs it in this one process. The 20 slowest tests are listed at the end, and every
# test's time is in .venv/junit.xml (what tests/suite_order.py's HEAVY table is checked against).
TEST_JOBS ?= auto
test: $(TSTAMP) test-deps lint bytecode
	$(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=20 \
	  --junitxml=$(VENV)/junit.xml

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor fails
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# ruff (pyflakes, pycodestyle, bugbear) everywhere; mypy, strict on store/analysis/report
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# On a machine with an NVIDIA GPU: the cuda-marked tests, a real OOM under --simulate-gpu, and the
# real allocator outputs saved under tests/data (tests/gpu_check.py). Without a GPU it stops with
# one line. The Python is the first of the venv's and python3 whose torch sees a GPU.
GPU_PYTHON ?= $(shell for p in $(BIN)/python python3; do $$p -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null && { echo $$p; exit; }; done; [ -x $(BIN)/python ] && echo $(BIN)/python || echo python3)
gpu-check:
	@PYTHONPATH=$(CURDIR):$(CURDIR)/tui$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) tests/gpu_check.py

bench: install
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) site demo.db demo.db-wal demo.db-shm
