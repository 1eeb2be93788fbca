"""A training started with plain ``python``, for the ``memscope attach --pid`` tests.

It trains a small model for ``--steps`` steps (``--sleep`` seconds between them), keeping one
64 KiB tensor a step in ``kept`` with ``--leak``; says ``at step N`` on stdout every 10 steps;
``--fast-file F``: once F exists, no more sleeping (the losses do not depend on it); with
``--block-at K --block-s S`` its main thread sleeps S seconds in one C call at step K (no
bytecode runs there); with ``--block-fifo F`` instead it blocks reading the FIFO F until a byte
comes. ``--oom-after F``: after the end, wait for F, then fail with an uncaught CPU out-of-memory
error in a forward (exit 1). At the end it prints one JSON line: the losses' digest, the leak's own
count of bytes per kept tensor, and what memscope could have left in the process (threads,
hooks, patched functions, trace functions), so a test compares it with a run never attached.
"""

import argparse
import gc
import hashlib
import json
import os
import sys
import threading
import time

import torch

ORIGINAL_BACKWARD = torch.autograd.backward


def state() -> dict:
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o

    return {
        "threads": sorted(t.name for t in threading.enumerate()),
        "optimizer_hooks": [len(o._global_optimizer_pre_hooks), len(o._global_optimizer_post_hooks)],
        "module_hooks": [len(m._global_forward_pre_hooks), len(m._global_forward_hooks),
                         len(m._global_backward_hooks), len(m._global_backward_pre_hooks)],
        "registration_hooks": [len(m._global_module_registration_hooks),
                               len(m._global_parameter_registration_hooks),
                               len(m._global_buffer_registration_hooks)],
        "backward_patched": torch.autograd.backward is not ORIGINAL_BACKWARD,
        "excepthook": sys.excepthook is sys.__excepthook__,
        "thread_excepthook": threading.excepthook is threading.__excepthook__,
        "unraisablehook": sys.unraisablehook is sys.__unraisablehook__,
        "gc_callbacks": len(gc.callbacks),
        "trace": sys.gettrace() is None and threading.gettrace() is None if hasattr(threading, "gettrace")
        else sys.gettrace() is None,
        "sys_path": sys.path,
        "memscope_imported": "memscope" in sys.modules,
        # the inventories' order of kinds names grad_fn classes (a script's own among them)
        "kinds_remembered": len(getattr(sys.modules.get("memscope.agent.collectors.inventory.scan"),
                                        "_FIRST_SEEN", ())),
        "main_keys": sorted(k for k in vars(sys.modules["__main__"]) if not k.startswith("__")),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--leak", action="store_true")
    p.add_argument("--block-at", type=int, default=-1)
    p.add_argument("--block-s", type=float, default=0.0)
    p.add_argument("--block-fifo", default=None, help="at --block-at, block reading this FIFO instead")
    p.add_argument("--fast-file", default=None, help="once this file exists, stop sleeping")
    p.add_argument("--oom-after", default=None, metavar="FILE",
                   help="after the state line, wait for FILE, then run a forward too big for memory")
    a = p.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    digest = hashlib.sha256()
    for step in range(a.steps):
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if a.leak:
            kept.append(torch.randn(256, 64))  # the leak: 64 KiB a step
        digest.update(f"{loss.item():.6f}".encode())
        if step % 10 == 0:
            print(f"at step {step}", flush=True)
        if step == a.block_at and a.block_fifo:
            with open(a.block_fifo, "rb") as fifo:  # C calls until the test writes: no bytecode runs
                fifo.read(1)
        elif step == a.block_at:
            time.sleep(a.block_s)  # one C call: the interpreter runs no bytecode meanwhile
        if a.sleep and not (a.fast_file and os.path.exists(a.fast_file)):
            time.sleep(a.sleep)
    out = {"digest": digest.hexdigest(), "steps": a.steps,
           "leak_bytes_each": (sum(t.nbytes for t in kept) // len(kept)) if kept else 0, **state()}
    print("STATE " + json.dumps(out), flush=True)
    if a.oom_after:
        while not os.path.exists(a.oom_after):
            time.sleep(0.05)  # bytecodes keep running: an attach can happen here
        model(torch.empty(1 << 42, 64))  # 1 PiB: the CPU allocator refuses it, nobody catches it


kept: list = []

if __name__ == "__main__":
    main()
