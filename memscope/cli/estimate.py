"""``memscope estimate``: training memory from numbers (``--params 7e9 --optimizer adamw ...``),
or from a script (``memscope estimate train.py ARGS``, by memscope.runners.script_estimate)."""

from __future__ import annotations

import argparse
import json
import re

from memscope.display import shown_text
from memscope.units import human_bytes
from memscope.analysis.estimate import OPTIMIZERS, PRECISIONS, Estimate, EstimateError, Inputs, estimate
from memscope.cli.errors import CliError

HELP = "estimate training memory from model numbers (or from a script)"
_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def count(text: str) -> float:
    """A parameter count: 7e9, 7000000000, 7B, 1.3b, 350M, 125k."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbgt]?)\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a parameter count: {text!r} (e.g. 7e9, 7B, 350M)")
    return float(m.group(1)) * _SUFFIX[m.group(2).lower()]


def register(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("memscope estimate [OPTIONS] SCRIPT.py [ARGS...]   (options before the script)\n"
                    "       memscope estimate --params N | --layers L --hidden H [...]")
    parser.add_argument("script", nargs="?", metavar="SCRIPT.py",
                        help="estimate from this training script's first steps, run fake (no memory)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script: everything after it is the script's")
    parser.add_argument("--measure", action="store_true",
                        help="with a script: run 2 real steps on CPU instead of a fake run")
    parser.add_argument("--steps", type=int, default=2, metavar="N",
                        help="with a script: fake steps to run (default %(default)s)")
    parser.add_argument("--cpu", action="store_true",
                        help="with a script: no pretend GPU (torch.cuda.is_available() stays False)")
    parser.add_argument("--params", type=count, help="parameter count (7e9, 7B, 350M)")
    parser.add_argument("--optimizer", default="adamw", choices=list(OPTIMIZERS),
                        help="optimizer (default adamw)")
    parser.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                        help="fp32; amp (autocast over fp32 weights); bf16/fp16 (16-bit weights, "
                             "fp32 master and states); pure-bf16 (default fp32)")
    parser.add_argument("--batch", type=int, help="micro-batch per GPU (sequences)")
    parser.add_argument("--seq", type=int, help="sequence length (tokens)")
    parser.add_argument("--layers", type=int, help="transformer layers")
    parser.add_argument("--hidden", type=int, help="hidden size")
    parser.add_argument("--heads", type=int, help="attention heads (default hidden / 128)")
    parser.add_argument("--vocab", type=int, help="vocabulary size (adds the logits)")
    parser.add_argument("--world-size", type=int, default=1, help="data-parallel ranks (default 1)")
    parser.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3],
                        help="ZeRO stage: 1 shards optimizer states, 2 + gradients, 3 (FSDP) + weights")
    parser.add_argument("--checkpointing", action="store_true",
                        help="full activation checkpointing of every layer")
    parser.add_argument("--flash-attention", action="store_true",
                        help="attention that never stores the N x N scores (SDPA / flash)")
    parser.add_argument("--no-dropout", action="store_true", help="no dropout masks")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")


def run(args: argparse.Namespace) -> int:
    if args.script:
        from memscope.cli import progress
        from memscope.runners import script_estimate  # runs the script: only when asked

        return int(script_estimate.run(args, progress=progress.callback()))
    inputs = Inputs(params=args.params, optimizer=args.optimizer, precision=args.precision,
                    batch=args.batch, seq=args.seq, layers=args.layers, hidden=args.hidden,
                    heads=args.heads, vocab=args.vocab, world_size=args.world_size, zero=args.zero,
                    checkpointing=args.checkpointing, flash_attention=args.flash_attention,
                    dropout=not args.no_dropout)
    try:
        est = estimate(inputs)
    except EstimateError as exc:
        raise CliError(f"estimate: {exc}") from None
    print(json.dumps(est.as_json(), indent=2) if args.json else render(est))
    return 0


def render(e: Estimate) -> str:
    i = e.inputs
    where = f"{i.world_size} ranks, ZeRO stage {i.zero}" if i.world_size > 1 or i.zero else "1 GPU"
    lines = [f"estimate  {_count(e.params)} parameters · {i.optimizer} · {i.precision} · {where}"]
    rows = [("weights", e.components["parameters"], e.bytes_per_param["weights"]),
            ("gradients", e.components["gradients"], e.bytes_per_param["gradients"]),
            ("optimizer state", e.components["optimizer_state"], e.bytes_per_param["optimizer_state"])]
    for name, n, per in rows:
        lines.append(f"  {name:<16} {_size(n):>24}   {per:g} bytes/param")
    per_param = sum(e.bytes_per_param.values())
    lines.append(f"  {'model states':<16} {_size(e.model_states):>24}   {per_param:g} bytes/param")
    acts = e.components["activations"]
    if acts is not None:
        how = "full checkpointing" if i.checkpointing else f"{i.layers} layers x {_size(e.activations_per_layer)}"
        lines.append(f"  {'activations':<16} {_size(acts):>24}   {how} (Korthikanti et al.) + output layer")
    lines.append(f"  {'total':<16} {_size(e.total):>24}   before allocator caching and the CUDA context")
    lines.extend(f"note      {shown_text(n)}" for n in e.notes)
    return "\n".join(lines)


def _size(n: int | None) -> str:
    """Decimal GB (as the rules of thumb say them) and binary GiB."""
    if n is None:
        return "-"
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB ({human_bytes(n)})"
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB ({human_bytes(n)})"
    return f"{n / 1e3:.1f} kB ({human_bytes(n)})"


def _count(n: int) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)
