"""The heap reading every inventory takes (agent/collectors/heap.py): glibc's own figure, read
from inside the training without starting any process (ctypes.util.find_library("c") runs
ldconfig, or a compiler, as a child of the training: 10 ms, and a fork of a big process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import ctypes, json, os, subprocess
    started = []
    real_init = subprocess.Popen.__init__
    def spy(self, *a, **k):
        started.append(a[0] if a else k.get("args"))
        return real_init(self, *a, **k)
    subprocess.Popen.__init__ = spy
    real_fork = os.fork
    os.fork = lambda: started.append("fork") or real_fork()
    from memscope.agent.collectors import heap
    first = heap.malloc_in_use()
    # glibc's count moves with what the process mallocs: 64 MiB more is seen as about that
    buf = ctypes.create_string_buffer(64 << 20)
    second = heap.malloc_in_use()
    print(json.dumps({"started": [str(s) for s in started], "first": first, "second": second}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2 (Linux)")
def test_the_heap_reading_starts_no_process_and_is_glibc_s_count() -> None:
    import json

    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["started"] == []
    if got["first"] is None:  # a libc without mallinfo2 (musl, glibc < 2.33): said as None
        pytest.skip("no mallinfo2 in this libc")
    grew = got["second"] - got["first"]
    assert 64 << 20 <= grew < (64 << 20) + (1 << 20)
