"""``memscope import`` on hostile and malformed pickles, and on a 3-million-segment snapshot.

Hostile: pickles that would run code (each would create a marker file): refused, nothing runs.
Malformed but harmless (inf / nan sizes, sets, bytes keys and values, deep nesting, memo bombs,
truncated files): one line and exit 2, quickly, and no run file. A big snapshot built the way
issue #14 found it (one segment referenced 3 million times: a 6 MB pickle) imports into a small
run file. Timings are in benchmarks/snapshot_import.py, not asserted here.
"""

from __future__ import annotations

import copyreg
import json
import os
import pickle
import sqlite3
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import cli, memscope, report_json
from memscope.store.schema import RunFileError
from memscope.store.snapshot import import_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
import make_snapshot  # noqa: E402 - tests/data: the documented format, built by hand

HANG_GUARD_S = 60  # generous: each case takes well under a second on an idle machine


# -- hostile: would run code -----------------------------------------------------------------

def _reduce(fn: Callable[..., Any], *args: Any) -> type:
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (fn, args)
    return Evil


def hostile(marker: str) -> dict[str, bytes]:
    """Pickles that, unpickled by a plain ``pickle.load``, would create ``marker``."""
    import builtins
    import subprocess

    cmd = f"touch {marker}"
    out: dict[str, bytes] = {}
    reducers = {
        "os.system": _reduce(os.system, cmd),
        "subprocess.call": _reduce(subprocess.call, ["touch", marker]),
        "builtins.exec": _reduce(builtins.exec, f"open({marker!r}, 'w').close()"),
        "builtins.eval": _reduce(builtins.eval, f"open({marker!r}, 'w')"),
        "builtins.open": _reduce(builtins.open, marker, "w"),
    }
    for name, cls in reducers.items():
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            out[f"{name}/p{proto}"] = pickle.dumps({"segments": [], "x": cls()}, protocol=proto)
        # inside a segment, where the importer reads
        out[f"{name}/in-segment"] = pickle.dumps({"segments": [{"total_size": 1, "device": cls()}]})
    m = marker.encode()
    # raw opcodes: GLOBAL + REDUCE, STACK_GLOBAL, INST, OBJ, NEWOBJ, EXT, persistent ids
    out["raw GLOBAL posix.system"] = b"cposix\nsystem\n(V" + b"touch " + m + b"\ntR."
    out["raw STACK_GLOBAL os.system"] = (b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" +
                                         bytes([len(b"touch " + m)]) + b"touch " + m + b"\x85R.")
    out["raw INST os.system"] = b"(V" + b"touch " + m + b"\nios\nsystem\n."
    out["raw OBJ os.system"] = b"(cos\nsystem\nV" + b"touch " + m + b"\no."
    out["raw NEWOBJ"] = b"\x80\x02cos\nsystem\n)\x81."
    out["raw PERSID"] = b"Ptouch\n."
    out["raw BINPERSID"] = b"\x80\x02X\x05\x00\x00\x00touch" + b"Q."
    copyreg.add_extension("os", "system", 0x7FF0)
    try:
        out["raw EXT2 (registered here)"] = b"\x80\x02\x83\xf0\x7f(V" + b"touch " + m + b"\ntR."
    finally:
        copyreg.remove_extension("os", "system", 0x7FF0)
    return out


def test_hostile_pickles_run_no_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    corpus = hostile(str(marker))
    assert len(corpus) >= 40
    for name, data in corpus.items():
        snap = tmp_path / "evil.pickle"
        snap.write_bytes(data)
        db = tmp_path / "evil.db"
        with pytest.raises(RunFileError) as err:
            import_snapshot(str(snap), str(db))
        message = str(err.value)
        assert "\n" not in message and message, name
        assert not marker.exists(), f"{name} ran code"
        assert not db.exists() and not list(tmp_path.glob("evil.db*")), name
    # through the command line, as a user meets it
    snap = tmp_path / "evil.pickle"
    snap.write_bytes(corpus["os.system/p2"])
    out = memscope("import", str(snap), "--db", str(tmp_path / "cli.db"), timeout=HANG_GUARD_S)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "unsafe or invalid pickle" in out.stderr
    assert "refuses to load posix.system" in out.stderr or "refuses to load os.system" in out.stderr
    assert not marker.exists() and not (tmp_path / "cli.db").exists()


# -- malformed but harmless -------------------------------------------------------------------

def _snap(**seg: Any) -> dict[str, Any]:
    base = {"device": 0, "address": 1 << 40, "total_size": 2 << 20, "allocated_size": 512,
            "blocks": [{"size": 512, "state": "active_allocated", "frames": []},
                       {"size": (2 << 20) - 512, "state": "inactive", "frames": []}]}
    base.update(seg)
    return {"segments": [base], "device_traces": [[]]}


DEPTH = 200_000
# [[[...]]] nested DEPTH deep, as raw pickle opcodes (pickle.dumps itself would recurse):
# EMPTY_LIST DEPTH times, then APPEND each into the one before
DEEP = b"]" * DEPTH + b"a" * (DEPTH - 1)


def _text(s: str) -> bytes:
    raw = s.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def deep_segments() -> bytes:
    """{"segments": [DEEP]}"""
    return b"\x80\x02}" + _text("segments") + b"]" + DEEP + b"as."


def deep_traces() -> bytes:
    """{"segments": [], "device_traces": [[DEEP]]}"""
    return (b"\x80\x02}" + _text("segments") + b"]s" + _text("device_traces") + b"]]" + DEEP + b"aas.")


def deep_frames() -> bytes:
    """{"segments": [{"total_size": 1, "frames": DEEP}]}"""
    return (b"\x80\x02}" + _text("segments") + b"]}" + _text("total_size") + b"K\x01s" + _text("frames")
            + DEEP + b"sas.")


def with_deep_extra(snap: dict[str, Any]) -> bytes:
    """``snap`` plus a key "extra" holding DEEP (SETITEM on the unpickled dict before STOP)."""
    base = pickle.dumps(snap, protocol=2)
    assert base.endswith(b".")
    return base[:-1] + _text("extra") + DEEP + b"s."


def _memo_bomb() -> dict[str, Any]:
    """About 1 MB of pickle; a walk that follows every reference visits ~10^14 leaves."""
    frames = [{"filename": "/x/torch/nn/modules/module.py", "line": 1, "name": "f"}] * 1000
    block = {"size": 1, "state": "inactive", "frames": frames}
    blocks = [block] * 1000
    segs = [{"total_size": 1000, "blocks": blocks, "frames": frames} for _ in range(100)] * 1000
    entry = {"action": "alloc", "size": 1, "frames": frames}
    trace = [entry] * 100_000
    return {"segments": segs, "device_traces": [trace] * 8}


MALFORMED: dict[str, tuple[Callable[[], Any], str]] = {
    "inf size": (lambda: _snap(total_size=float("inf")), "segments[0]['total_size'] is inf, not a byte count"),
    "nan size": (lambda: _snap(total_size=float("nan")), "segments[0]['total_size'] is nan"),
    "negative size": (lambda: _snap(allocated_size=-5), "is -5, not a byte count"),
    "fractional size": (lambda: _snap(total_size=1.5), "is 1.5, not a byte count"),
    "bool size": (lambda: _snap(total_size=True), "is True, not a byte count"),
    "string size": (lambda: _snap(total_size="12"), "is '12', not a byte count"),
    "size past 2**63": (lambda: _snap(total_size=1 << 70), "not a byte count"),
    "inf block size": (lambda: _snap(blocks=[{"size": float("-inf"), "state": "inactive"}]),
                       "segments[0]['blocks'][0]['size'] is -inf"),
    "inf oom size": (lambda: {"segments": [], "device_traces": [[{"action": "oom", "size": float("inf")}]]},
                     "device_traces[0][0]['size'] is inf"),
    "device index absurd": (lambda: _snap(device=10 ** 9), "not a device index"),
    "too many device traces": (lambda: {"segments": [], "device_traces": [[]] * 5000}, "5,000 device traces"),
    "set of segments": (lambda: {"segments": {1, 2}}, "no 'segments' list"),
    "set of blocks": (lambda: _snap(blocks={1, 2}), "segments[0]['blocks'] is a set, not a list"),
    "frozenset of frames": (lambda: _snap(frames=frozenset({1})), "is a frozenset, not a list of frames"),
    "set as a segment": (lambda: {"segments": [{1, 2}]}, "segments[0] is a set, not a dict"),
    "bytes keys at the top": (lambda: {b"segments": []}, "no 'segments' list"),
    "bytes keys in a segment": (lambda: {"segments": [{b"total_size": 5}]}, "segments[0] has no 'total_size'"),
    "bytes segment type": (lambda: _snap(segment_type=b"large"), "is b'large', not a string"),
    "bytes file name": (lambda: _snap(frames=[{"filename": b"/home/x.py", "line": 1}]),
                        "['filename'] is b'/home/x.py', not a string"),
    "string line number": (lambda: _snap(frames=[{"filename": "/x.py", "line": "4"}]), "not a line number"),
    "deeply nested segments": (deep_segments, "segments[0] is a list, not a dict"),
    "deeply nested traces": (deep_traces, "device_traces[0][0] is a list, not a dict"),
    "deeply nested frames": (deep_frames, "segments[0]['frames'][0] is a list, not a dict"),
    "segments not a list": (lambda: {"segments": "abc"}, "no 'segments' list"),
    "not a dict at all": (lambda: [1, 2, 3], "no 'segments' list"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_snapshot_is_one_line(tmp_path: Path, name: str) -> None:
    build, expected = MALFORMED[name]
    snap = tmp_path / "bad.pickle"
    made = build()
    snap.write_bytes(made if isinstance(made, bytes) else pickle.dumps(made, protocol=4))
    db = tmp_path / "bad.db"
    with pytest.raises(RunFileError) as err:
        import_snapshot(str(snap), str(db))
    message = str(err.value)
    assert expected in message and "\n" not in message, message
    assert message.startswith(str(snap))
    assert not db.exists() and not list(tmp_path.glob("bad.db*"))


def test_malformed_through_the_command_line(tmp_path: Path) -> None:
    """As a user meets them: one line on stderr, exit 2, no traceback, no run file."""
    cases = {"inf": _snap(total_size=float("inf")), "set": _snap(blocks={1}), "bytes": {b"segments": []}}
    raw = {"deep": deep_segments(), "truncated": pickle.dumps(_snap(), protocol=4)[:-20], "empty": b"",
           "text": b"hello\n", "huge int": b"I" + b"9" * 20000 + b"\n.",
           "huge bytes claim": b"\x80\x04\x8e" + (1 << 62).to_bytes(8, "little")}
    files = {k: pickle.dumps(v, protocol=4) for k, v in cases.items()} | raw
    for name, data in files.items():
        snap = tmp_path / f"{name.replace(' ', '_')}.pickle"
        snap.write_bytes(data)
        db = tmp_path / "x.db"
        out = memscope("import", str(snap), "--db", str(db), timeout=HANG_GUARD_S)
        assert out.returncode == 2, (name, out.stderr)
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("memscope: error: "), (name, out.stderr)
        assert "Traceback" not in out.stderr and not db.exists(), name


def test_memo_bomb_does_not_hang(tmp_path: Path) -> None:
    snap = tmp_path / "bomb.pickle"
    data = pickle.dumps(_memo_bomb(), protocol=4)
    assert len(data) < 2_000_000
    snap.write_bytes(data)
    db = tmp_path / "bomb.db"
    # harmless and in the documented format: it imports, each container summarised once
    out = memscope("import", str(snap), "--db", str(db), timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr
    assert "100000 segment(s) on 1 device(s)" in out.stderr
    with sqlite3.connect(db) as conn:
        (dev,) = [json.loads(r[0]) for r in conn.execute("SELECT data FROM events WHERE kind = 'snapshot_device'")]
        traces = [json.loads(r[0]) for r in conn.execute("SELECT data FROM events WHERE kind = 'snapshot_trace'")]
    assert dev["segments"] == 100_000 and dev["reserved_bytes"] == 100_000 * 1000
    assert dev["blocks"] == 100_000 * 1000 and dev["largest_free_block_bytes"] == 1
    assert len(traces) == 8 and all(t["entries"] == 100_000 and t["actions"] == {"alloc": 100_000} for t in traces)


def test_ignored_keys_may_hold_anything(tmp_path: Path) -> None:
    """Keys memscope does not read are not checked: a deep list or a set there imports fine."""
    snap = make_snapshot.snapshot()
    snap["segments"][0]["unknown"] = float("inf")
    deep = tmp_path / "deep.pickle"
    deep.write_bytes(with_deep_extra(snap))
    assert import_snapshot(str(deep), str(tmp_path / "deep.db"))["segments"] == 2
    snap["more"] = {"set": {1, 2}, b"bytes": float("nan")}  # a set: protocol 4 has an opcode for it
    odd = tmp_path / "odd.pickle"
    odd.write_bytes(pickle.dumps(snap, protocol=4))
    counts = import_snapshot(str(odd), str(tmp_path / "odd.db"))
    assert counts["segments"] == 2 and counts["ooms"] == 1


def test_force_keeps_the_old_file_until_the_new_one_is_made(tmp_path: Path) -> None:
    good = tmp_path / "good.pickle"
    good.write_bytes(make_snapshot.dumps())
    db = tmp_path / "run.db"
    assert memscope("import", str(good), "--db", str(db)).returncode == 0
    before = db.read_bytes()
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps(_snap(total_size=float("nan"))))
    out = memscope("import", str(bad), "--db", str(db), "--force")
    assert out.returncode == 2 and "is nan" in out.stderr
    assert db.read_bytes() == before  # no data lost
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pickle", "good.pickle", "run.db"]
    assert memscope("import", str(good), "--db", str(db), "--force").returncode == 0
    assert report_json(db)["oom"]["requested_bytes"] == 2 ** 30 + 2 * 2 ** 20


@pytest.mark.slow
def test_three_million_segments(tmp_path: Path) -> None:
    """Issue #14's big snapshot: one segment referenced 3 million times, a 6 MB pickle."""
    snap = make_snapshot.snapshot()
    seg = snap["segments"][1]
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps({"segments": [seg] * 3_000_000, "device_traces": snap["device_traces"]},
                                  protocol=4))
    db = tmp_path / "big.db"
    out = memscope("import", str(path), "--db", str(db), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "3000000 segment(s) on 1 device(s), 1 out-of-memory event(s)" in out.stderr
    assert db.stat().st_size <= 3 * path.stat().st_size
    details = json.loads(cli("oom", str(db), "--json").stdout)["details"]
    assert details["segments"] == 3_000_000 and details["reserved_bytes"] == 3_000_000 * 2 * 2 ** 20
    assert details["allocated_bytes"] == 3_000_000 * 512
    assert details["inactive_split_bytes"] == 3_000_000 * (2 * 2 ** 20 - 512)
    with sqlite3.connect(db) as conn:
        kinds = dict(conn.execute("SELECT kind, count(*) FROM events GROUP BY kind").fetchall())
    assert kinds["snapshot_segment"] == 100 and kinds["snapshot_site"] == 1
