"""The test suite's processes only (tests/conftest.py puts this directory on PYTHONPATH; memscope's
bootstrap runs it as the user's sitecustomize): skip the interpreter's last garbage collection.

A process that imported torch and torch._dynamo spends 0.8-1 s of CPU at exit collecting and
freeing their objects (an 8-step tiny_gpt attach run: 3.5 -> 2.7 s), a few hundred such
processes a suite. ``gc.freeze()`` as the last exit handler leaves them to the OS. Every exit
handler still runs (memscope's, the script's); what is skipped is the collection after them,
and with it any noise a finalizer there could print. The tests about that noise (tests/compat,
whose arms compare plain and attached runs, and test_hostile_agent) set MEMSCOPE_TEST_SLOW_EXIT=1.
"""

import atexit
import gc
import os

if os.environ.get("MEMSCOPE_TEST_SLOW_EXIT") != "1":
    atexit.register(gc.freeze)  # registered before the script's own: they run before it
