"""Per-layer activation attribution: real training on CPU, real run files, analytic checks.

Expected bytes are derived from which tensors autograd saves for backward, op by op:
``Linear`` (addmm) saves its input (and its weight, a parameter: not an activation); ``ReLU``
saves its output; ``GELU`` saves its input; a batched ``matmul`` saves both operands;
``masked_fill`` saves its mask; ``softmax`` saves its output; division by a Python number saves
nothing. A storage saved twice counts once, for its first saver.
"""

from __future__ import annotations

import gc
import json
import math
import sqlite3
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules import module as nn_module
from torch.utils.checkpoint import checkpoint

import memscope
from conftest import EXAMPLES, memscope as run_cli, report_json
from memscope.analysis.hotspots import fold_name, hotspots
from shared_runs import shared_attach
from test_diff import GPT as NO_PROFILE_GPT

F32 = 4


def layer_rows(db: Path, step: int | None = None) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        if step is None:
            step = conn.execute("SELECT max(step) FROM layer_stats").fetchone()[0]
        rows = conn.execute("SELECT * FROM layer_stats WHERE step = ?", (step,)).fetchall()
    return {r["module"]: dict(r) for r in rows}


def profiled_steps(db: Path) -> list[int]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT DISTINCT step FROM layer_stats ORDER BY step")]


def train(model: nn.Module, make_batch: Any, steps: int, loss_fn: Any = None) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = make_batch()
        out = model(x)
        loss = loss_fn(out) if loss_fn else out.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


# -- accuracy --------------------------------------------------------------------------------

def test_mlp_bytes_match_analytic_values(tmp_path: Path) -> None:
    B, D_IN, D_H = 64, 512, 1024
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D_IN, D_H), nn.ReLU(), nn.Linear(D_H, D_IN))
    db = tmp_path / "mlp.db"
    with memscope.profile(str(db), layers_every=1, layers_first=0):
        train(model, lambda: torch.randn(B, D_IN), 3)
    assert profiled_steps(db) == [0, 1, 2]
    for step in (0, 2):  # step 0 (installed at start) and a later one
        rows = layer_rows(db, step)
        expected = {
            "0": B * D_IN * F32,   # Linear saves its input
            "1": B * D_H * F32,    # ReLU saves its output ...
            "2": 0,                # ... which is also Linear 2's input: counted once, for ReLU
            "<no module>": B * D_IN * F32,  # the loss's pow saves the model output
        }
        for name, want in expected.items():
            got = rows[name]["saved_bytes"]
            assert got == want, (step, name, got, want)  # to the byte, as measured
        assert rows[""]["type"] == "Sequential" and rows[""]["saved_bytes"] == 0
        assert rows["0"]["type"] == "Linear" and rows["0"]["calls"] == 1
        assert rows["1"]["output_bytes"] == B * D_H * F32
        assert rows["0"]["forward_s"] > 0
    with sqlite3.connect(db) as conn:
        bd = conn.execute("SELECT parameters, gradients, optimizer_state, activations"
                          " FROM step_breakdown WHERE step = 2").fetchone()
    params = sum(p.numel() * F32 for p in model.parameters())
    assert bd[0] == params and bd[1] == params
    # Adam: exp_avg and exp_avg_sq, and one float32 step counter a parameter
    assert bd[2] == 2 * params + F32 * len(list(model.parameters()))
    assert bd[3] >= sum(expected.values())  # the activations alive together at the peak


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        attn = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))


def test_attention_scores_land_on_the_attention_module(tmp_path: Path) -> None:
    B, N, D, H = 4, 128, 64, 4
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(D), Attention(D, H))
    db = tmp_path / "attn.db"
    with memscope.profile(str(db), layers_every=1, layers_first=0):
        train(model, lambda: torch.randn(B, N, D), 2)
    rows = layer_rows(db)
    # matmuls save q, k and v (B*H*N*(D/H) elements each: 3*B*N*D in all, copies made by the
    # batched matmul's reshape, or the qkv output they view); masked_fill saves the N x N bool
    # mask; softmax saves its B x H x N x N output (which attn @ v saves again: counted once).
    want_attn = 3 * B * N * D * F32 + B * H * N * N * F32 + N * N
    got = rows["1"]["saved_bytes"]
    assert rows["1"]["type"] == "Attention"
    assert got == want_attn, (got, want_attn)
    assert rows["1.qkv"]["saved_bytes"] == B * N * D * F32   # its input (LayerNorm output)
    assert rows["1.proj"]["saved_bytes"] == B * N * D * F32  # the reshaped attention output
    spots = hotspots(rows.values())
    assert spots[0].module == "1" and spots[0].share > 0.5


# -- the example under attach ----------------------------------------------------------------

def test_tiny_gpt_hotspots_by_block(tmp_path: Path) -> None:
    db = tmp_path / "gpt.db"
    out = run_cli("attach", "--headless", "--db", str(db), "--layers-every", "1",
                  str(EXAMPLES / "tiny_gpt.py"), "--steps", "4", "--seq", "96")
    assert out.returncode == 0, out.stderr
    assert profiled_steps(db) == [1, 2, 3]
    report = report_json(db)
    spots = report["hotspots"]
    assert {h["module"] for h in spots[:2]} == {"blocks.0.attn", "blocks.1.attn"}
    assert all(h["type"] == "NaiveAttention" for h in spots[:2])
    assert set(spots[0]) == {"module", "type", "activation_bytes", "share"}
    sizes = [h["activation_bytes"] for h in spots]
    assert sizes == sorted(sizes, reverse=True) and all(s > 0 for s in sizes)
    assert abs(sum(h["share"] for h in spots) - 1) < 0.01
    bd = report["peak"]["breakdown"]
    # (leaked: what leaking groups held at the peak, additive; 0 here)
    assert set(bd) == {"parameters", "gradients", "optimizer_state", "activations", "leaked", "other"}
    assert bd["leaked"] == 0
    assert bd["parameters"] > 0 and bd["activations"] > 0 and bd["other"] >= 0

    flat = run_cli("layers", str(db), "--json")
    folded = run_cli("layers", str(db), "--depth", "2", "--json")
    assert flat.returncode == 0 and folded.returncode == 0, flat.stderr + folded.stderr
    flat_mods = json.loads(flat.stdout)["modules"]
    fold_mods = {m["module"]: m for m in json.loads(folded.stdout)["modules"]}
    for block in ("blocks.0", "blocks.1"):
        want = sum(m["activation_bytes"] for m in flat_mods
                   if m["module"] == block or m["module"].startswith(block + "."))
        assert fold_mods[block]["activation_bytes"] == want > 0
        assert fold_mods[block]["type"] == "Block"
    assert all(name.count(".") <= 1 for name in fold_mods)
    text = run_cli("layers", str(db), "--depth", "2")
    assert text.returncode == 0 and "blocks.0" in text.stdout and "Block" in text.stdout
    assert "hotspots" in run_cli("report", str(db)).stdout
    bad = run_cli("layers", str(db), "--step", "0")
    assert bad.returncode == 2 and "not profiled" in bad.stderr and "Traceback" not in bad.stderr


def test_fold_name() -> None:
    assert fold_name("blocks.1.attn.qkv", 2) == "blocks.1"
    assert fold_name("blocks.1", 2) == "blocks.1"
    assert fold_name("head", 1) == "head"
    assert fold_name("blocks.1.attn", None) == "blocks.1.attn"


# -- cadence ---------------------------------------------------------------------------------

def test_default_cadence_profiles_step_1_only(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # at the defaults: step 1 only, not 0 or 2-7 (the dashboard tests' 8-step run of tiny_gpt at
    # default options, made once per session: tests/shared_runs.py); then every 3rd from 0
    db, out = shared_attach(tmp_path_factory, [], ["examples/tiny_gpt.py", "--steps", "8"])
    assert out.returncode == 0, out.stderr
    assert profiled_steps(db) == [1] and report_json(db)["run"]["steps"] == 8
    db2 = tmp_path / "c2.db"
    out = run_cli("attach", "--headless", "--db", str(db2), "--layers-every", "3", "--layers-first", "0",
                  str(EXAMPLES / "tiny_gpt.py"), "--steps", "7", "--eval-every", "0")
    assert out.returncode == 0, out.stderr
    assert profiled_steps(db2) == [0, 3, 6]
    # never: the run tests/test_diff.py compares against, made once per session
    db3, out = shared_attach(tmp_path_factory, ["--layers-every", "0"], ["examples/tiny_gpt.py", *NO_PROFILE_GPT])
    assert out.returncode == 0, out.stderr
    assert profiled_steps(db3) == [] and report_json(db3)["hotspots"] == []
    bad = run_cli("attach", "--headless", "--db", str(tmp_path / "x.db"), "--layers-every", "-1",
                  str(EXAMPLES / "tiny_gpt.py"))
    assert bad.returncode == 2 and "layers_every" in bad.stderr


def test_hooks_are_removed_between_profiled_steps(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[tuple[int, bool]] = []
    with memscope.profile(str(tmp_path / "h.db"), layers_every=4, layers_first=1) as agent:
        for i in range(7):
            assert agent.current_step == i
            hooked = bool(nn_module._global_forward_pre_hooks) and bool(nn_module._global_forward_hooks)
            saved = torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
            seen.append((i, hooked and saved))
            loss = model(torch.randn(8, 32)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert [i for i, on in seen if on] == [1, 5]
    assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert profiled_steps(tmp_path / "h.db") == [1, 5]


# -- no references kept ----------------------------------------------------------------------

class Recorder(nn.Module):
    """Keeps weak references to its intermediate activations."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 256)
        self.b = nn.Linear(256, 64)
        self.refs: list[weakref.ref[torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.a(x))
        self.refs.append(weakref.ref(h))
        return self.b(h)


def test_profiler_keeps_no_activation_alive(tmp_path: Path) -> None:
    model = Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memscope.profile(str(tmp_path / "w.db"), layers_every=1, layers_first=0) as agent:
        for _ in range(3):
            loss = model(torch.randn(16, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            del loss
            gc.collect()
            assert all(r() is None for r in model.refs), agent.current_step
        # a step cut short by stop(): its forward's activations still die with the graph
        loss = model(torch.randn(16, 64)).pow(2).mean()
    del loss
    gc.collect()
    assert len(model.refs) == 4 and all(r() is None for r in model.refs)
    assert layer_rows(tmp_path / "w.db")["a"]["saved_bytes"] == 16 * 64 * F32


# -- checkpointing and torch.compile ---------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d: int = 128) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x)


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


def subtree(rows: dict[str, dict[str, Any]], prefix: str) -> int:
    return sum(r["saved_bytes"] for name, r in rows.items() if name == prefix or name.startswith(prefix + "."))


def test_checkpointed_block_reports_fewer_saved_bytes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Checkpointed())
    db = tmp_path / "ck.db"
    with memscope.profile(str(db), layers_every=1, layers_first=0):
        train(model, lambda: torch.randn(32, 128), 2)
    rows = layer_rows(db)
    plain, ckpt = subtree(rows, "0"), subtree(rows, "1")
    assert plain > 0 and 0 < ckpt < plain / 4
    assert ckpt == 32 * 128 * F32  # checkpointing keeps the block's input
    # recomputation in backward is not a second forward call
    assert rows["1.inner.f.0"]["calls"] == 1


def test_torch_compile_does_not_crash(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    try:
        compiled = torch.compile(model, backend="aot_eager")
        compiled(torch.randn(4, 128)).sum().backward()
    except Exception as exc:  # pragma: no cover - depends on the box
        pytest.skip(f"torch.compile does not work here: {type(exc).__name__}: {exc}")
    db = tmp_path / "tc.db"
    x = torch.randn(32, 128)
    expected = compiled(x)
    with memscope.profile(str(db), layers_every=2, layers_first=0):
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        for _ in range(4):
            out = compiled(x)
            assert torch.equal(out, expected)  # what the model computes is unchanged
            out.sum().backward()
            opt.step()
            opt.zero_grad()
    rows = layer_rows(db)
    assert profiled_steps(db) == [0, 2]
    # memory inside the compiled region is charged to the module that called it
    assert sum(r["saved_bytes"] for r in rows.values()) > 0
    assert not nn_module._global_forward_pre_hooks


# -- the run file ----------------------------------------------------------------------------

def test_schema_1_file_migrates_and_reads_without_layers(tmp_path: Path) -> None:
    from memscope.store.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, _split_statements, migrate
    from memscope.store.reader import RunReader
    from memscope.analysis.summary import summarize

    db = tmp_path / "v1.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    for statement in _split_statements(MIGRATIONS[0]):
        conn.execute(statement)
    conn.execute("INSERT INTO run (id, command, started, status) VALUES (1, '[]', 0, 'finished')")
    conn.execute("PRAGMA user_version = 1")
    # a version-1 file reads as it is: no hotspots, no breakdown, a clear 'layers' answer
    with RunReader(db) as reader:
        s = summarize(reader)
        assert s.hotspots == [] and s.peak.breakdown is None
    out = run_cli("layers", str(db))
    assert out.returncode == 2 and "no profiled step" in out.stderr
    migrate(conn, str(db))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # 2 and later
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"layer_stats", "step_breakdown"} <= names
    conn.close()
    assert run_cli("layers", str(tmp_path / "missing.db")).returncode == 2
    depth = run_cli("layers", str(db), "--depth", "0")
    assert depth.returncode == 2 and "--depth" in depth.stderr


# -- backward time per module ----------------------------------------------------------------

class _SlowBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps, so the module using it has a known backward time."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        import time
        time.sleep(0.08)
        return g


class SlowBack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SlowBackward.apply(self.fc(x))


def test_backward_time_per_module(tmp_path: Path) -> None:
    """backward_s: from the gradient reaching the module's output to the gradient of its input
    being ready, children included; the graph and the results are unchanged."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), SlowBack(), nn.ReLU(), nn.Linear(32, 4))
    ref = nn.Sequential(nn.Linear(32, 32), SlowBack(), nn.ReLU(), nn.Linear(32, 4))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(8, 32)
    db = tmp_path / "bw.db"
    with memscope.profile(str(db), layers_every=1, layers_first=0):
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # steps end at opt.step()
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
    ref(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, 2 * q.grad)  # two backward passes accumulated, same values
    rows = layer_rows(db)
    assert profiled_steps(db) == [0, 1]
    slow, fc, first, root = rows["1"], rows["1.fc"], rows["0"], rows[""]
    # no wall-clock limits (a loaded machine stretches any step): only what the order of the
    # pass fixes. The sleep lasts at least 0.08 s; a child's window lies inside its parent's, after
    # the sleep; siblings' windows follow one another inside the root's (EPS: clock reads apart).
    EPS = 0.005
    assert slow["backward_s"] >= 0.08  # its own sleeping node
    assert fc["backward_s"] <= slow["backward_s"] - 0.08 + EPS  # a child that does not sleep
    assert first["backward_s"] is not None  # ends with the pass
    assert rows["3"]["backward_s"] + slow["backward_s"] + first["backward_s"] <= root["backward_s"] + EPS
    assert all(r["alloc_delta"] is None and r["alloc_peak"] is None for r in rows.values())  # CPU
    # hooks on graph nodes are gone after the step: a later backward of a kept graph is harmless
    assert not nn_module._global_forward_hooks


@pytest.mark.cuda
def test_cuda_allocator_delta_and_peak_per_module(tmp_path: Path) -> None:
    """On CUDA, a module whose temporary lifts the process's peak has that peak as alloc_peak and
    an alloc_delta of about its output; a module that stays under an earlier peak has no
    alloc_peak (unknown, not a lower bound dressed as one); the script's own peak counter is not
    reset."""
    MIB = 1 << 20
    extra = {"bytes": 0}

    class Spike(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            tmp = torch.empty(extra["bytes"] // 4, device=x.device)  # freed on return
            tmp.fill_(1.0)
            return x * 2

    model = nn.Sequential(nn.Linear(256, 256), Spike()).cuda()
    x = torch.randn(64, 256, device="cuda")
    extra["bytes"] = 64 * MIB
    for _ in range(2):  # warm-up: the 64 MiB spike is in the process's peak already, and the
        model(x).sum().backward()  # gradients exist as they will in the profiled steps
    torch.cuda.synchronize()
    peak_before = torch.cuda.max_memory_allocated()
    db = tmp_path / "cuda.db"
    with memscope.profile(str(db), layers_every=1, layers_first=0):
        model(x).sum().backward()  # step 0: under the earlier peak
        extra["bytes"] = peak_before + 64 * MIB  # step 1: lifts the peak whatever is allocated
        model(x).sum().backward()
    assert torch.cuda.max_memory_allocated() >= peak_before  # never reset by memscope
    with sqlite3.connect(db) as conn:
        steps = [r[0] for r in conn.execute("SELECT DISTINCT step FROM layer_stats ORDER BY step")]
    assert len(steps) == 2, steps
    first, second = layer_rows(db, steps[0]), layer_rows(db, steps[1])
    assert first["1"]["alloc_peak"] is None and first["0"]["alloc_peak"] is None
    assert peak_before + 64 * MIB <= second["1"]["alloc_peak"] <= peak_before + 64 * MIB + MIB
    assert second["1"]["alloc_delta"] < MIB  # the output only
    assert second[""]["alloc_peak"] >= second["1"]["alloc_peak"]
