"""``memscope fit [OPTIONS] SCRIPT.py [ARGS...] --gpu SIZE``: will this training fit that GPU, with
which batch, and with which techniques (memscope.runners.fit)."""

from __future__ import annotations

import argparse

from memscope.analysis.fit import CUDA_CONTEXT, FRAGMENTATION

HELP = "the largest micro-batch and the cheapest techniques that fit a GPU size, from fake runs"


def register(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("memscope fit --gpu SIZE [--world-size N] [--batch-arg NAME] [--json] "
                    "SCRIPT.py [ARGS...]   (options before the script)")
    parser.add_argument("script", nargs="?", metavar="SCRIPT.py", help="training script, run fake and unchanged")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the script's own arguments: everything after it is the script's")
    parser.add_argument("--gpu", metavar="SIZE", help="the GPU's memory: 24GiB, 80GB, 16G (required)")
    parser.add_argument("--world-size", type=int, default=1, metavar="N",
                        help="data-parallel ranks, for ZeRO / FSDP sharding plans (default 1)")
    parser.add_argument("--batch-arg", metavar="NAME",
                        help="the script's option that sets the micro-batch (--bs), or DataLoader "
                             "(default: an option named like --batch-size, else the DataLoader's)")
    parser.add_argument("--cuda-context", metavar="SIZE", default=f"{CUDA_CONTEXT >> 20}MiB",
                        help="memory the CUDA context takes outside torch's allocator "
                             "(default %(default)s)")
    parser.add_argument("--fragmentation", type=float, default=FRAGMENTATION, metavar="F",
                        help="share of the GPU kept free for the caching allocator's "
                             "fragmentation (default %(default)s)")
    parser.add_argument("--cpu", action="store_true",
                        help="no pretend GPU in the fake runs (torch.cuda.is_available() stays False)")
    parser.add_argument("--json", action="store_true", help="print the memscope.fit/1 JSON document")


def run(args: argparse.Namespace) -> int:
    from memscope.cli import progress
    from memscope.runners import fit  # runs fake trials: only when asked

    return int(fit.run(args, say=progress.info, progress=progress.callback()))
