# make demo / make test work on a fresh clone: both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.memscope-installed
TSTAMP := $(VENV)/.memscope-test-installed

.PHONY: install demo test test-deps lint checks docs dist bench gpu-check clean bytecode screenshots

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is the user's own: install the pinned CPU build only when the venv has none, and never
# let installing memscope replace it (torch is not among memscope's requirements).
# The dev tools are pyproject's dependency group `dev` (PEP 735, never published): pip installs a
# group from 25.1 on (--group), and a venv's own pip is older (Python 3.11's: 23.2), so the
# venv's pip is brought up to it first. The dashboard is the `tui` extra of the one distribution
# (a venv made before that has the old memscope-tui distribution: removed).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q "pip>=25.1"
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q --no-compile "torch==2.13.0" numpy
	! $(BIN)/python -m pip show -q memscope-tui 2>/dev/null || $(BIN)/python -m pip uninstall -q -y memscope-tui
	$(BIN)/python -m pip install -q --no-compile -e ".[tui]" --group dev
	$(SITE_COMPILE)
	$(COMPILE)
	touch $(STAMP)

# Every installed module byte-compiled, on every core. Compiled they must be: where
# PYTHONDONTWRITEBYTECODE=1 is set (this machine's environment) nothing else ever writes them and
# each process of the suite compiled torch from source (a fresh clone installed --no-compile and
# not compiled: 20.4 minutes of pytest instead of 13.7, host-RSS tests failing). pip compiles what
# it installs on one core (43 of a fresh install's 78 s here); compileall -j 0 the same files in
# 19 s on two. A file this Python cannot compile (torch ships a Python 3.12 sample) is skipped, as
# pip skips it; a second pass finds the files already compiled in 4 s.
SITE_COMPILE = $(BIN)/python -m compileall -q -j 0 \
	  "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null || true

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
	$(BIN)/python -m pip install -q --no-compile -c $(VENV)/torch-constraint.txt -e ".[tui,integrations]" --group dev
	$(SITE_COMPILE)
	touch $(TSTAMP)

# the sdist and the wheel into dist/, as tests/test_packaging.py builds them (the sdist from the
# files git sees, the wheel from the unpacked sdist; nothing written into the checkout)
dist: $(STAMP)
	$(BIN)/python tests/packaging_venvs.py dist

demo: install
	$(BIN)/memscope attach --headless --force --db demo.db examples/tiny_gpt.py --steps 30
	$(BIN)/memscope report demo.db

# System tools the end-to-end tests drive: tmux (a real terminal for the dashboard), headless
# Chromium (opens the HTML report), gdb and lldb (memscope attach --pid injects through them: gdb
# 13 cannot restore the registers of CPUs with AMX state, so lldb is what works on such a
# machine), zsh and fish (memscope completion's scripts, completed in the real shells).
# Installed from Debian's packages when missing; where that is not possible the tests that need
# them fail and say why.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
test-deps:
	@missing=""; \
	command -v tmux >/dev/null 2>&1 || missing="$$missing tmux"; \
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v gdb >/dev/null 2>&1 || missing="$$missing gdb"; \
	command -v lldb >/dev/null 2>&1 || missing="$$missing lldb"; \
	command -v zsh >/dev/null 2>&1 || missing="$$missing zsh"; \
	command -v fish >/dev/null 2>&1 || missing="$$missing fish"; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing from Debian's packages"; \
	    ($(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq$$missing >/dev/null) \
	      || echo "warning: could not install$$missing; the tests that need them will fail saying why"; \
	  else echo "warning:$$missing not installed and no apt-get; the tests that need them will fail saying why"; fi; \
	fi

# The suite on TEST_JOBS workers (pytest-xdist; auto: one per core). --dist loadfile keeps each
# test file on one worker, so a module's shared real runs (module-scoped fixtures) are made once.
# TEST_JOBS=0 runs it in this one process. The 20 slowest tests are listed at the end, and every
# test's time is in .venv/junit.xml (what tests/suite_order.py's HEAVY table is checked against).
#
# make checks (lint and the site's strict build) runs beside the suite at the idle CPU priority
# (SCHED_IDLE, or nice 19 where chrt cannot set it): it takes only the CPU the suite leaves, so
# the cold mypy of a fresh clone (43 s on one core) is off the serial path. A 3-minute slice of
# the suite measured 185 s with it beside, 181-193 s alone; at normal priority, 211 s. Its output
# comes after the suite's; a failure is said at once, and make test fails if either fails.
# The checks run in a session of their own (setsid) so that an interrupted make test stops them
# too (the trap); the suite stays in the foreground, where Ctrl-C and the tests' own SIGINTs
# reach its processes (a background job of a non-interactive shell ignores SIGINT, and so do the
# processes it starts: the tests that interrupt a training then fail).
TEST_JOBS ?= auto
IDLE := $(shell chrt -i 0 true 2>/dev/null && echo "chrt -i 0" || echo "nice -n 19")
SETSID := $(shell command -v setsid 2>/dev/null)
test: $(TSTAMP) test-deps bytecode
	@rm -f $(VENV)/checks.rc; echo "make checks (lint, the docs' build) runs beside the suite: its output comes after"; \
	$(SETSID) sh -c '$(IDLE) $(MAKE) --no-print-directory checks >$(VENV)/checks.log 2>&1; rc=$$?; \
	  echo $$rc >$(VENV)/checks.rc; [ $$rc = 0 ] || printf "\nmake test: make checks failed; its output follows the suite\n" >&2' & \
	checks=$$!; trap 'kill -TERM -$$checks 2>/dev/null || kill -TERM $$checks; exit 130' INT TERM; \
	echo "$(BIN)/python -m pytest $(PYTEST_ARGS)"; $(BIN)/python -m pytest $(PYTEST_ARGS); tests=$$?; \
	wait; echo "--- make checks:"; cat $(VENV)/checks.log; checked=$$(cat $(VENV)/checks.rc 2>/dev/null || echo 1); \
	[ $$checked = 0 ] || echo "make test: make checks failed (above)" >&2; \
	[ $$tests = 0 ] && [ $$checked = 0 ]
PYTEST_ARGS = -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=20 --junitxml=$(VENV)/junit.xml

# The docs' screenshots (docs/images: the dashboard at 80x24 and 160x48, the HTML page at 1,400
# and 600 px in headless Chromium), made again from the fixed run file tests/tui/data/leaky.sqlite
screenshots: $(STAMP) test-deps
	$(BIN)/python tests/screenshots.py

# what make test checks besides the suite: lint, and the site builds with --strict
checks: lint
	$(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site

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
