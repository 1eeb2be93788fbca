"""A small training given secrets on its command line (tests/test_secrets.py).

It must see its arguments exactly as given (memscope redacts only the stored copy): it exits 3
when ``sys.argv[1:]`` is not the JSON list in the environment's ``SECRET_ARGV_EXPECT``. With
``SECRET_ARGV_SNAP=DIR``, at its third step it copies the run file and its -wal as they are
mid-run into DIR (what another user could read while the run goes on).
"""

import json
import os
import shutil
import sys

import torch


def main() -> int:
    expect = json.loads(os.environ["SECRET_ARGV_EXPECT"])
    if sys.argv[1:] != expect:
        print(f"argv changed: {len(sys.argv) - 1} arguments, not {len(expect)}", file=sys.stderr)
        return 3
    rank = os.environ.get("RANK", "0")
    model = torch.nn.Linear(32, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        model(torch.randn(16, 32)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        snap = os.environ.get("SECRET_ARGV_SNAP")
        if step == 2 and snap and os.environ.get("MEMSCOPE_DB"):
            import time

            time.sleep(0.6)  # the writer's flushes: the rows so far are in the file or its -wal
            for suffix in ("", "-wal"):
                src = os.environ["MEMSCOPE_DB"] + suffix
                if os.path.exists(src):
                    shutil.copyfile(src, os.path.join(snap, f"rank{rank}{suffix or '.db'}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
