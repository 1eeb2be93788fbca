"""Which scaled_dot_product_attention kernel a module ran, seen by the layer profile (issue #23):
real training on CPU, real run files. On CPU, attention dropout sends SDPA to its math kernel,
which stores the N x N scores as explicit attention does; the profile tells the two apart by
the backward node of what was saved (``SafeSoftmaxBackward0`` against ``SoftmaxBackward0``), and
the advice stops telling a model already on SDPA to switch to it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memscope
from memscope.agent.collectors.layers.kernels import SDPA_NODES
from memscope.analysis.summary import summarize
from memscope.analysis.suggestions import gather, suggest
from memscope.analysis.suggestions.efficient_attention import efficient_attention
from memscope.store.reader import RunReader

B, T, D, HEADS = 8, 128, 64, 4
pytestmark = pytest.mark.skipif(not hasattr(torch._C._functions, "SafeSoftmaxBackward0"),
                                reason="torch < 2.5: SDPA's math kernel calls softmax, not _safe_softmax")


class Attention(nn.Module):
    """One attention layer, explicit (softmax, dropout) or through SDPA, same weights."""

    def __init__(self, sdpa: bool, dropout: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.sdpa, self.dropout = sdpa, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(B, T, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / (D // HEADS) ** 0.5
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            att = F.dropout(scores.masked_fill(~mask, float("-inf")).softmax(-1), self.dropout)
            y = att @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class Model(nn.Module):
    def __init__(self, sdpa: bool, dropout: float) -> None:
        super().__init__()
        self.attn = Attention(sdpa, dropout)
        self.mlp = nn.Sequential(nn.Linear(D, 8 * D), nn.GELU(), nn.Linear(8 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


def train(sdpa: bool, dropout: float, db: Path | None) -> list[torch.Tensor]:
    """Three steps, profiled (every step) when ``db`` is given; the trained weights."""
    torch.manual_seed(0)
    model = Model(sdpa, dropout)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loop() -> None:
        for _ in range(3):
            loss = model(torch.randn(B, T, D)).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    if db is None:
        loop()
    else:
        with memscope.profile(str(db), layers_every=1, layers_first=0, inventory_every=0):
            loop()
    return [p.detach().clone() for p in model.parameters()]


def kernel_events(db: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        return [json.loads(r[0]) for r in conn.execute(
            "SELECT data FROM events WHERE kind = 'attention_kernels' ORDER BY t")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, sdpa, dropout in (("explicit", False, 0.2), ("math", True, 0.2), ("flash", True, 0.0)):
        out[name] = tmp_path_factory.mktemp(name) / "run.db"
        train(sdpa, dropout, out[name])
    return out


def test_the_kernel_sdpa_ran_is_recorded_per_module_and_step(runs: dict[str, Path]) -> None:
    assert kernel_events(runs["explicit"]) == []  # softmax by hand: no SDPA kernel
    for kernel in ("math", "flash"):  # CPU: dropout takes the math kernel, none the flash one
        events = kernel_events(runs[kernel])
        assert [e["step"] for e in events] == [0, 1, 2], events
        assert all(e["modules"] == {"attn": {kernel: 1}} for e in events), events


def test_a_model_already_on_sdpa_is_not_told_to_switch(runs: dict[str, Path]) -> None:
    """Explicit attention with dropout stores the scores and is told to use SDPA; the same
    model through SDPA (math kernel, the scores stored alike) is not, and its mixed-precision
    evidence says the math kernel keeps them in float32."""
    def by_technique(db: Path) -> dict[str, Any]:
        with RunReader(str(db)) as reader:
            return {s.technique: s for s in suggest(reader)}
    explicit, math = by_technique(runs["explicit"]), by_technique(runs["math"])
    assert "efficient_attention" in explicit
    assert "efficient_attention" not in math
    evidence = math["mixed_precision"].evidence
    assert "scaled_dot_product_attention's math kernel" in evidence and "in attn:" in evidence
    assert "math kernel" not in explicit["mixed_precision"].evidence
    # the math kernel's saving is kept fp32: the figure is smaller than explicit attention's
    assert math["mixed_precision"].estimated_saving_bytes < explicit["mixed_precision"].estimated_saving_bytes


def test_on_cuda_the_math_kernel_is_a_refused_fused_kernel(runs: dict[str, Path]) -> None:
    """The rule on the math run's own rows, read as if on CUDA (no GPU here): there a fused
    kernel takes dropout, so the math kernel means one refused the call. The scores are what a
    fused kernel would not store: a figure, and the advice to find why it refused; a fused
    kernel's run gets nothing."""
    with RunReader(str(runs["math"])) as reader:
        facts = gather(reader, summarize(reader))
    assert facts is not None and facts.attention_kernels == {"attn": {"math": 1}}
    assert efficient_attention(facts) == []  # on CPU: no kernel would store less
    got = efficient_attention(dataclasses.replace(facts, device="cuda:0"))
    assert len(got) == 1 and got[0].estimated_saving_bytes > 0, got
    assert "already call scaled_dot_product_attention" in got[0].how and "sdpa_kernel(" in got[0].how
    fused = dataclasses.replace(facts, device="cuda:0", attention_kernels={"attn": {"efficient": 1}})
    assert efficient_attention(fused) == []


def test_recording_the_kernel_changes_nothing_in_the_training(tmp_path: Path) -> None:
    """The same seeded run (dropout on: its RNG draws must not move) with and without the
    profile ends with the same weights, bit for bit."""
    plain = train(True, 0.2, None)
    profiled = train(True, 0.2, tmp_path / "run.db")
    assert kernel_events(tmp_path / "run.db"), "the profile did not see the kernel"
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))


def test_every_backward_node_named_exists_in_this_torch() -> None:
    """The kernels are told apart by class name: a name torch renamed would never match."""
    missing = [n for n in SDPA_NODES if not hasattr(torch._C._functions, n)]
    assert not missing, missing


@pytest.mark.slow
def test_a_compiled_model_runs_unchanged_and_no_kernel_is_claimed(tmp_path: Path) -> None:
    """Under torch.compile (fullgraph: a graph break would raise) the saved tensors come from the
    compiled graph's own backward node: the run trains as without the profile, no kernel is
    named, and the hook reads nothing while Dynamo traces."""
    import torch._dynamo

    def run(db: Path | None) -> list[torch.Tensor]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Model(True, 0.2)
        step = torch.compile(model, backend="aot_eager", fullgraph=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with memscope.profile(str(db), layers_every=1, layers_first=0, inventory_every=0) if db else \
                contextlib.nullcontext():
            for _ in range(3):
                loss = step(torch.randn(B, T, D)).pow(2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return [p.detach().clone() for p in model.parameters()]
    plain, profiled = run(None), run(tmp_path / "run.db")
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))
    assert kernel_events(tmp_path / "run.db") == []
    with sqlite3.connect(tmp_path / "run.db") as conn:  # the profile did run on those steps
        assert conn.execute("SELECT count(DISTINCT step) FROM layer_stats").fetchone()[0] == 3
