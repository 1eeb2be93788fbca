"""The test suite's processes only (tests/conftest.py puts this directory on PYTHONPATH; memscope's
bootstrap runs it as the user's sitecustomize): skip the interpreter's last garbage collection.

A process that imported torch and torch._dynamo spends 0.8-1 s of CPU at exit collecting and
freeing their objects (an 8-step tiny_gpt attach run: 3.5 -> 2.7 s), a few hundred such
processes a suite. ``gc.freeze()`` as an exit handler leaves them to the OS. Every exit handler
still runs: the script's before it (registered later), memscope's agent after it (armed by the
bootstrap before this file runs; what it makes then is young and collected as usual). What is
skipped is the final collection of what existed before, and any noise a finalizer there prints.
The tests about that noise (tests/compat, whose arms compare plain and attached runs, and
test_hostile_agent) set MEMSCOPE_TEST_SLOW_EXIT=1.
"""

import atexit
import gc
import os

if os.environ.get("MEMSCOPE_TEST_SLOW_EXIT") != "1":
    atexit.register(gc.freeze)  # before the script's own handlers: they run first
