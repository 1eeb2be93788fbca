"""A process for the node tests (memscope top / memscope daemon), started with plain ``python``.

``--mode leak``: trains a small model at one step every ``--period`` seconds of wall time (a step
that falls behind, the machine busy, is caught up at once, so memory grows steadily in time),
keeping one 64 KiB tensor a step in ``kept``. ``healthy``: the same training, keeping nothing.
``idle``: imports torch and sleeps. ``plain``: Python without torch, sleeping. ``mapper``: Python
without torch that maps libtorch's file to read it, as a debugger reading its symbols does (gdb or
lldb attaching to a training), never to run it. Prints ``ready``
after its warm-up (30 steps when training), then runs until killed or ``--seconds`` pass.
``--tag`` is only there to be seen in the command line (a test's daemon watches only its own).
``--fifo PATH``: make a named pipe there and hold it open for reading with no writer (a tool
that opened it to look inside would wait forever).
"""

import argparse
import sys
import time

kept: list = []


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("leak", "healthy", "idle", "plain", "mapper"), required=True)
    p.add_argument("--period", type=float, default=0.05)
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--tag", default="")
    p.add_argument("--fifo", default=None)
    a = p.parse_args()
    if a.fifo:
        import os

        os.mkfifo(a.fifo, 0o600)
        kept.append(os.open(a.fifo, os.O_RDONLY | os.O_NONBLOCK))
    end = time.monotonic() + a.seconds
    if a.mode in ("plain", "mapper"):
        if a.mode == "mapper":
            import importlib.util
            import mmap
            import os

            spec = importlib.util.find_spec("torch")
            lib = os.path.join(os.path.dirname(spec.origin), "lib", "libtorch_cpu.so")
            with open(lib, "rb") as f:
                kept.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY))  # rw-p, as lldb maps it
        print("ready", flush=True)
        while time.monotonic() < end:
            time.sleep(0.2)
        return
    import torch

    if a.mode == "idle":
        print("ready", flush=True)
        while time.monotonic() < end:
            time.sleep(0.2)
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.monotonic()
    step = 0
    while time.monotonic() < end:
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if a.mode == "leak":
            kept.append(torch.randn(256, 64))  # the leak: 64 KiB a step
        step += 1
        if step == 30:
            print("ready", flush=True)
        wait = start + step * a.period - time.monotonic()
        if wait > 0:
            time.sleep(wait)


if __name__ == "__main__":
    sys.exit(main())
