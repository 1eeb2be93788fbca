"""Configurable small training loop used by the tests.

--mode optimizer|backward|manual|gan|accum ; --steps N ; --eval-every K (no_grad eval)
--exit CODE (exit with it at the end) ; --sleep S (per step) ; --kill-self-at N (SIGKILL self)
--dump FILE (write argv, sys.path[0], __name__, cwd as JSON) ; --workers N [--spawn] (DataLoader)
--hold-at N --hold-file FILE (before step N, wait until FILE exists: a test decides when it goes on)
--inductor-worker (first start torch's real Inductor compile-worker entry, as torch.compile does on
a GPU, asking it only for --help: it imports torch, then exits)
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

def main():
    global args, model, data
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="optimizer")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--kill-self-at", type=int, default=-1)
    p.add_argument("--dump")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--spawn", action="store_true")
    p.add_argument("--hold-at", type=int, default=-1)
    p.add_argument("--hold-file")
    p.add_argument("--inductor-worker", action="store_true")
    p.add_argument("rest", nargs="*", help="ignored; lets tests pass odd arguments through")
    args = p.parse_args()

    if args.dump:
        with open(args.dump, "w") as f:
            json.dump({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(),
                       "sitecustomize_marker": os.environ.get("USER_SITECUSTOMIZE_RAN")}, f)

    if args.inductor_worker:
        import subprocess
        entry = os.path.join(os.path.dirname(torch.__file__), "_inductor", "compile_worker", "__main__.py")
        subprocess.run([sys.executable, entry, "--help"], check=True, stdout=subprocess.DEVNULL)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


    def batches():
        if args.workers:
            ds = torch.utils.data.TensorDataset(torch.randn(16 * args.steps * args.accum, 32),
                                                torch.randint(0, 4, (16 * args.steps * args.accum,)))
            ctx = "spawn" if args.spawn else None
            dl = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=args.workers,
                                             multiprocessing_context=ctx)
            yield from dl
        else:
            while True:
                yield torch.randn(16, 32), torch.randint(0, 4, (16,))


    def evaluate():
        with torch.no_grad():
            model(torch.randn(16, 32)).sum().item()


    data = batches()
    if args.mode == "gan":
        other = nn.Linear(4, 1)
        opt_d = torch.optim.SGD(model.parameters(), lr=0.01)
        opt_g = torch.optim.Adam(other.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01) if args.mode in ("optimizer", "accum", "manual") else None

    for step in range(args.steps):
        if step == args.hold_at and args.hold_file:
            deadline = time.monotonic() + 300
            while not os.path.exists(args.hold_file) and time.monotonic() < deadline:
                time.sleep(0.05)
        if step == args.kill_self_at:
            time.sleep(0.6)  # let the writer flush what the finished steps produced
            os.kill(os.getpid(), signal.SIGKILL)
        if args.mode == "accum":
            for _ in range(args.accum):
                x, y = next(data)
                (F.cross_entropy(model(x), y) / args.accum).backward()
            opt.step()
            opt.zero_grad()
        elif args.mode == "gan":
            x, y = next(data)
            F.cross_entropy(model(x), y).backward()
            opt_d.step()
            opt_d.zero_grad()
            other(model(x).detach()).mean().backward()
            opt_g.step()
            opt_g.zero_grad()
        else:
            x, y = next(data)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            else:
                with torch.no_grad():
                    for prm in model.parameters():
                        prm -= 0.01 * prm.grad
                        prm.grad = None
            if args.mode == "manual":
                import memscope
                memscope.step()
        if args.eval_every and (step + 1) % args.eval_every == 0:
            evaluate()
        if args.sleep:
            time.sleep(args.sleep)

    sys.exit(args.exit)


if __name__ == "__main__":
    main()
