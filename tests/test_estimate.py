"""``memscope estimate`` (numbers mode): the published rules of thumb, and the measured
breakdown of real runs of examples/tiny_gpt.py."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES, memscope
from memscope.analysis.estimate import Inputs, estimate, layer_activation_bytes, param_count
from memscope.cli import main as cli_main


def cli_json(*args: str) -> dict[str, Any]:
    out = memscope("estimate", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def states(doc: dict[str, Any]) -> int:
    c = doc["components"]
    return c["parameters"] + c["gradients"] + c["optimizer_state"]


def test_seven_billion_fp32_adam_needs_112_gb() -> None:
    doc = cli_json("--params", "7e9", "--optimizer", "adamw", "--precision", "fp32")
    assert doc["bytes_per_param"] == {"weights": 4, "gradients": 4, "optimizer_state": 8}
    assert states(doc) == 112_000_000_000
    assert doc["components"]["activations"] is None
    text = memscope("estimate", "--params", "7B", "--optimizer", "adam")
    assert text.returncode == 0 and "112.0 GB" in text.stdout and "16 bytes/param" in text.stdout


def test_mixed_precision_adam_is_2_2_12_bytes_per_param() -> None:
    """ZeRO paper, section 3.1: fp16 weights and gradients, fp32 master weights, momentum and
    variance: 2 + 2 + (4 + 4 + 4) = 16 bytes per parameter."""
    for precision in ("bf16", "fp16"):
        doc = cli_json("--params", "1e9", "--precision", precision)
        assert doc["bytes_per_param"] == {"weights": 2, "gradients": 2, "optimizer_state": 12}
        assert states(doc) == 16_000_000_000
    pure = cli_json("--params", "1e9", "--precision", "pure-bf16")
    assert states(pure) == 8_000_000_000  # Adam states kept in bf16 as well
    sgd = cli_json("--params", "1e9", "--precision", "fp32", "--optimizer", "sgd")
    assert states(sgd) == 8_000_000_000


@pytest.mark.parametrize("zero, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_stages_match_the_paper(zero: int, expected_gb: float) -> None:
    """ZeRO paper, figure 1: a 7.5B model on 64 GPUs with mixed-precision Adam (K = 12)."""
    doc = cli_json("--params", "7.5e9", "--precision", "fp16", "--world-size", "64",
                   "--zero", str(zero))
    assert round(states(doc) / 1e9, 1) == expected_gb


def test_zero_3_divides_everything_by_the_world_size() -> None:
    one = estimate(Inputs(params=7e9, precision="bf16"))
    eight = estimate(Inputs(params=7e9, precision="bf16", world_size=8, zero=3))
    assert eight.model_states * 8 == one.model_states


def test_activation_formula_of_korthikanti_et_al() -> None:
    """s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit with dropout (their equation 1), on the
    GPT-3 175B shape of their table 3; without dropout the 1-byte masks and the dropout output
    go; flash attention drops the s^2 term for a logsumexp; full recomputation keeps 2sbh."""
    s, b, h, a = 2048, 1, 12288, 96
    assert layer_activation_bytes(s, b, h, a, elem=2) == s * b * h * (34 + 5 * a * s // h)
    assert layer_activation_bytes(s, b, h, a, elem=2, dropout=False) == 32 * s * b * h + 2 * a * s * s * b
    assert layer_activation_bytes(s, b, h, a, elem=2, dropout=False, flash=True) == 32 * s * b * h + 4 * a * s * b
    full = estimate(Inputs(params=175e9, precision="bf16", batch=b, seq=s, layers=96, hidden=h, heads=a))
    ckpt = estimate(Inputs(params=175e9, precision="bf16", batch=b, seq=s, layers=96, hidden=h, heads=a,
                           checkpointing=True))
    per_layer = s * b * h * (34 + 5 * a * s // h)
    output = 2 * 2 * s * b * h  # final norm and head inputs
    assert full.components["activations"] == 96 * per_layer + output
    assert ckpt.components["activations"] == 96 * 2 * s * b * h + per_layer + output


def test_parameter_count_from_the_shape() -> None:
    # GPT-2 small: 12 layers, 768 wide, 50257 tokens, 1024 positions: 124M (tied head)
    assert round(param_count(12, 768, 50257, 1024) / 1e6) == 124


# -- against measured runs ------------------------------------------------------------------------

def tiny_gpt_params(vocab: int, d: int, heads: int, layers: int, seq: int) -> int:
    sys.path.insert(0, str(EXAMPLES))
    try:
        from tiny_gpt import TinyGPT
    finally:
        sys.path.remove(str(EXAMPLES))
    return sum(p.numel() for p in TinyGPT(vocab, d, heads, layers, seq).parameters())


@pytest.mark.parametrize("batch, seq, layers", [(8, 64, 2), (4, 128, 3)])
def test_matches_the_measured_breakdown_of_tiny_gpt(tmp_path: Path, batch: int, seq: int,
                                                    layers: int) -> None:
    """Model states must match to the byte (bar Adam's step counters); activations within 2%:
    the formula leaves out LayerNorm's mean and rstd (8 bytes per token per norm), the causal
    mask (n^2 bytes per layer) and the integer targets, about 0.5-1% here, while leaving out
    any one of its own terms would cost more than 2% (the smallest, a norm input, is 1/17 of a
    layer's n x d part). On CPU the run's peak is host RSS (the interpreter and libraries
    included), so the estimate is compared with the measured tensor breakdown, not with RSS."""
    d, heads, vocab = 64, 4, 256
    db = tmp_path / "gpt.db"
    out = memscope("attach", "--headless", "--db", str(db), "--layers-every", "1",
                   str(EXAMPLES / "tiny_gpt.py"), "--steps", "3", "--eval-every", "0",
                   "--batch", str(batch), "--seq", str(seq), "--layers", str(layers),
                   "--d-model", str(d), "--heads", str(heads), "--vocab", str(vocab), timeout=240)
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(db) as conn:
        p, g, o, a = conn.execute("SELECT parameters, gradients, optimizer_state, activations "
                                  "FROM step_breakdown ORDER BY step DESC LIMIT 1").fetchone()
    n = tiny_gpt_params(vocab, d, heads, layers, seq)
    doc = cli_json("--params", str(n), "--optimizer", "adamw", "--precision", "fp32",
                   "--batch", str(batch), "--seq", str(seq), "--layers", str(layers),
                   "--hidden", str(d), "--heads", str(heads), "--vocab", str(vocab), "--no-dropout")
    c = doc["components"]
    assert c["parameters"] == p and c["gradients"] == g
    assert 0 <= o - c["optimizer_state"] <= 4 * 64  # AdamW's 0-d step tensors
    assert abs(c["activations"] - a) <= 0.02 * a, (c["activations"], a)
    assert abs(doc["total_bytes"] - (p + g + o + a)) <= 0.02 * (p + g + o + a)


# -- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--params", "lots"], "not a parameter count"),
    ([], "give --params N"),
    (["--params", "1e9", "--batch", "8"], "need --batch, --seq, --layers and --hidden"),
    (["--params", "1e9", "--batch", "0", "--seq", "8", "--layers", "2", "--hidden", "8"],
     "--batch must be a positive integer"),
    (["--params", "1e9", "--world-size", "0"], "--world-size must be at least 1"),
    (["--params", "1e9", "--precision", "fp8"], "invalid choice"),
])
def test_bad_numbers_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = memscope("estimate", *args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_script_goes_to_the_script_mode_with_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    import memscope.runners.script_estimate as se
    seen: dict[str, Any] = {}
    monkeypatch.setattr(se, "run", lambda args, **_: seen.update(script=args.script, rest=args.script_args) or 0)
    assert cli_main(["estimate", "train.py", "--lr", "3"]) == 0
    assert seen == {"script": "train.py", "rest": ["--lr", "3"]}


def test_the_shape_alone_gives_the_parameter_count() -> None:
    """Issue #15: --layers/--hidden/--vocab/--seq without --batch counts the parameters (the
    README's example) instead of failing on the activations."""
    doc = cli_json("--layers", "32", "--hidden", "4096", "--vocab", "32000", "--seq", "4096")
    assert doc["params"] == param_count(32, 4096, 32000, 4096)
    assert doc["components"]["activations"] is None
    assert any("add --batch" in n for n in doc["notes"])


def test_options_go_before_the_script_and_the_rest_is_the_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in attach: memscope's flags before SCRIPT.py, everything after it is the script's."""
    import memscope.runners.script_estimate as se
    seen: list[tuple[bool, list[str]]] = []
    monkeypatch.setattr(se, "run", lambda args, **_: seen.append((args.json, args.script_args)) or 0)
    assert cli_main(["estimate", "--json", "train.py", "--lr", "3"]) == 0
    assert cli_main(["estimate", "train.py", "--json"]) == 0
    assert seen == [(True, ["--lr", "3"]), (False, ["--json"])]
