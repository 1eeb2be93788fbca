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


FREED = textwrap.dedent("""
    import ctypes, json
    from memscope.agent.collectors import heap
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = heap.malloc_reading()
    # 4,000 chunks of 8 KiB (below the mmap threshold: on the heap), every other one freed: the
    # freed ones sit between chunks in use, so malloc keeps them as free bytes it cannot trim
    chunks = [libc.malloc(8192) for _ in range(4000)]
    for c in chunks[::2]:
        libc.free(c)
    after = heap.malloc_reading()
    print(json.dumps({"before": before, "after": after}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2 (Linux)")
def test_the_free_bytes_are_what_malloc_keeps_between_chunks_in_use() -> None:
    """The second figure of the reading: the free bytes malloc's arenas keep (what host memory in
    use leaves out of RSS). 2,000 freed 8 KiB chunks between chunks in use are about 16 MiB of
    them, and the bytes in use rose by the 2,000 kept."""
    import json

    got = json.loads(subprocess.run([sys.executable, "-c", FREED], capture_output=True, text=True,
                                    check=True).stdout)
    if got["before"] is None:
        pytest.skip("no mallinfo2 in this libc")
    (used0, free0), (used1, free1) = got["before"], got["after"]
    # the chunks made first may have taken free bytes there were before: the freed ones are kept
    assert 2000 * 8192 <= free1 < 2000 * 8192 + free0 + (1 << 20)
    assert 2000 * 8192 <= used1 - used0 < 2000 * 8192 + (1 << 20)
