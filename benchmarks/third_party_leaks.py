"""Leak verdicts at DEFAULT options on training scripts memscope's authors did not write.

Issue #20's leaks, injected into karpathy's scripts as the issue did (a line or two added to a
copy; nothing of theirs lives in this repository, and nothing is downloaded: point ``--repos``
at clones), plus each script's clean run. Per run it prints the first and the last inventory
step at which the leak was reported (the verdict a run ending there would get), whether it was
ever withdrawn after, the holder and storing line at the end, and the bytes and graph nodes per
step; a clean run must report nothing from step 20 on, and no growth nothing explains at its end.

* makemore (``makemore.py``, transformer, names.txt): ``history.append(loss)`` after backward;
  tensorboard's writer replaced by a no-op (not installed here);
* ng-video-lecture (``gpt.py``, input.txt): ``cache[iter] = logits``; hyperparameters shrunk;
* minGPT (``mingpt``'s GPT and Trainer, driven by a script written here: sorting digits, as
  its demo does): a callback keeping ``trainer.loss``;
* nanoGPT (``train.py``, shakespeare_char config on random tokens written here):
  ``LEAKED.append(loss)`` after backward.

    git clone https://github.com/karpathy/makemore DIR/makemore   # and ng-video-lecture, minGPT, nanoGPT
    .venv/bin/python benchmarks/third_party_leaks.py --repos DIR [makemore nanoGPT ...]
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memscope.analysis.leaks import Leak, find_leaks  # noqa: E402


@dataclass
class Script:
    repo: str
    script: str  # run from the copy's root
    args: list[str]
    leak: list[tuple[str, str]]  # (anchor, replacement) applied to the script for the leak run
    held_by: str
    stored: str  # the injected storing line's text (its line number is found in the copy)
    prepare: Callable[[Path], None] | None = None  # data, stubs: in the copy, before both runs
    common: list[tuple[str, str]] | None = None  # edits both runs need (sizes, stubs)


def _edit(path: Path, edits: list[tuple[str, str]]) -> None:
    text = path.read_text()
    for anchor, new in edits:
        if text.count(anchor) != 1:
            raise SystemExit(f"third_party_leaks: {path.name}: expected one {anchor.strip()!r}, "
                             f"found {text.count(anchor)} (another revision of the repository?)")
        text = text.replace(anchor, new)
    path.write_text(text)


_MINGPT_DRIVER = '''"""minGPT's GPT and Trainer on a tiny sorting task (written for memscope's benchmark)."""
import sys
import torch
from torch.utils.data import Dataset
from mingpt.model import GPT
from mingpt.trainer import Trainer

LEAK = "--leak" in sys.argv
kept_losses = []


class Sorting(Dataset):
    def __len__(self):
        return 10000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(3, (6,), generator=g)
        cat = torch.cat((x, torch.sort(x)[0]))
        y = cat[1:].clone()
        y[:5] = -1
        return cat[:-1], y


torch.manual_seed(0)
mc = GPT.get_default_config()
mc.model_type = None
mc.n_layer, mc.n_head, mc.n_embd = 2, 2, 48
mc.vocab_size, mc.block_size = 3, 11
model = GPT(mc)
tc = Trainer.get_default_config()
tc.learning_rate, tc.max_iters, tc.num_workers, tc.batch_size, tc.device = 5e-4, 300, 0, 32, "cpu"
trainer = Trainer(tc, model, Sorting())


def keep_loss(trainer):
    kept_losses.append(trainer.loss)  # the leak


if LEAK:
    trainer.set_callback("on_batch_end", keep_loss)
trainer.run()
'''


def _prepare_mingpt(copy: Path) -> None:
    (copy / "sort_demo.py").write_text(_MINGPT_DRIVER)


def _prepare_nanogpt(copy: Path) -> None:
    import numpy as np

    data = copy / "data" / "shakespeare_char"
    rng = np.random.default_rng(0)
    rng.integers(0, 65, 300_000, dtype=np.uint16).tofile(data / "train.bin")
    rng.integers(0, 65, 30_000, dtype=np.uint16).tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 65}, f)


SCRIPTS: dict[str, Script] = {
    "makemore": Script(
        "makemore", "makemore.py",
        ["--max-steps", "300", "--n-layer", "2", "--n-embd", "32", "--batch-size", "16", "--num-workers", "0",
         "--work-dir", "out"],
        [("    while True:\n", "    history = []\n    while True:\n"),
         ("        loss.backward()\n", "        loss.backward()\n        history.append(loss)\n")],
        "__main__.history", "history.append(loss)",
        common=[("from torch.utils.tensorboard import SummaryWriter\n",
                 "class SummaryWriter:  # tensorboard is not installed here\n"
                 "    def __init__(self, *a, **k): pass\n"
                 "    def add_scalar(self, *a, **k): pass\n"
                 "    def flush(self): pass\n")]),
    "ng-video-lecture": Script(
        "ng-video-lecture", "gpt.py", [],
        [("for iter in range(max_iters):\n", "cache = {}\nfor iter in range(max_iters):\n"),
         ("    logits, loss = model(xb, yb)\n", "    logits, loss = model(xb, yb)\n    cache[iter] = logits\n")],
        "__main__.cache", "cache[iter] = logits",
        common=[("batch_size = 64 ", "batch_size = 8 "), ("block_size = 256 ", "block_size = 32 "),
                ("max_iters = 5000\n", "max_iters = 300\n"), ("eval_interval = 500\n", "eval_interval = 100\n"),
                ("eval_iters = 200\n", "eval_iters = 10\n"), ("n_embd = 384\n", "n_embd = 64\n"),
                ("n_head = 6\n", "n_head = 4\n"), ("n_layer = 6\n", "n_layer = 2\n"),
                ("max_new_tokens=500", "max_new_tokens=20")]),
    "minGPT": Script("minGPT", "sort_demo.py", [], [("LEAK = \"--leak\" in sys.argv", "LEAK = True")],
                     "__main__.kept_losses", "kept_losses.append(trainer.loss)", prepare=_prepare_mingpt),
    "nanoGPT": Script(
        "nanoGPT", "train.py",
        ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=5",
         "--eval_interval=50", "--log_interval=50", "--block_size=32", "--batch_size=8", "--n_layer=2",
         "--n_head=2", "--n_embd=64", "--max_iters=200", "--lr_decay_iters=200", "--dropout=0.0",
         "--always_save_checkpoint=False"],
        [("from model import GPTConfig, GPT\n", "from model import GPTConfig, GPT\nLEAKED = []\n"),
         ("        scaler.scale(loss).backward()\n",
          "        scaler.scale(loss).backward()\n        LEAKED.append(loss)\n")],
        "__main__.LEAKED", "LEAKED.append(loss)", prepare=_prepare_nanogpt),
}


def _verdicts(db: Path) -> tuple[list[int], Callable[[int], list[Leak]]]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        inv = [r[0] for r in conn.execute("SELECT step FROM inventories ORDER BY step")]
        rows = [dict(r) for r in conn.execute("SELECT * FROM inventory_groups")]
        holders = [dict(r) for r in conn.execute("SELECT * FROM leak_holders ORDER BY step")]
    return inv, lambda last: find_leaks([s for s in inv if s <= last], [r for r in rows if r["step"] <= last],
                                        [h for h in holders if h["step"] <= last])


def _run(name: str, s: Script, repo: Path, tmp: Path, leak: bool) -> bool:
    copy = tmp / f"{name}-{'leak' if leak else 'clean'}"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    if s.prepare:
        s.prepare(copy)
    target = copy / s.script
    if s.common:
        _edit(target, s.common)
    if leak:
        _edit(target, s.leak)
    db = copy / "run.db"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db), s.script,
                          *s.args], cwd=copy, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    label = f"{name:17} {'leak ' if leak else 'clean'}"
    if out.returncode != 0:
        print(f"{label} the run failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
        return False
    steps, leaks_at = _verdicts(db)
    report = json.loads(subprocess.run([sys.executable, "-m", "memscope", "report", "--json", str(db)],
                                       capture_output=True, text=True, check=True).stdout)
    n = report["run"]["steps"]
    head = f"{label} {n} steps in {wall:.0f} s, {len(steps)} inventories (last at {steps[-1] if steps else None})"
    if not leak:
        wrong = [st for st in steps if st >= 20 and leaks_at(st)]
        growth = report.get("unexplained_growth")
        print(f"{head}: {'no leak' if not wrong else f'FALSE LEAK at steps {wrong[:5]}'}; "
              f"report --json leaks: {[lk['held_by'] for lk in report['leaks']]}, "
              f"unexplained_growth: {growth}")
        return not wrong and not report["leaks"] and growth is None
    mine = {st: [lk for lk in leaks_at(st) if lk.held_by == s.held_by] for st in steps}
    hits = [st for st in steps if mine[st]]
    withdrawn = [st for st in steps if hits and st > hits[0] and not mine[st]]
    lines = target.read_text().splitlines()
    stored = f"{s.script}:{next(i + 1 for i, ln in enumerate(lines) if ln.strip().startswith(s.stored))}"
    print(f"{head}: reported from step {hits[0] if hits else None} to {hits[-1] if hits else None}"
          + (f", WITHDRAWN at {withdrawn[:5]}" if withdrawn else ", never withdrawn"))
    end = report["leaks"]
    for lk in end:
        print(f"{'':17}       held by {lk['held_by']}, stored at {lk.get('site')} (made at {lk.get('created_at')}), "
              f"{lk['bytes_per_step'] / 1024:.1f} KiB/step, {lk.get('graph_nodes_per_step', 0):.0f} nodes/step")
    ok = bool(hits) and not withdrawn and [lk["held_by"] for lk in end] == [s.held_by]
    ok = ok and str(end[0].get("site", "")).endswith(stored)
    if not ok:
        print(f"{'':17}       expected: held by {s.held_by}, stored at {stored}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repos", required=True, type=Path, help="a directory holding clones named as on GitHub")
    ap.add_argument("names", nargs="*", help=f"a subset of: {', '.join(SCRIPTS)}")
    args = ap.parse_args()
    names = args.names or list(SCRIPTS)
    bad = 0
    with tempfile.TemporaryDirectory(prefix="third-party-") as tmp:
        for name in names:
            if name not in SCRIPTS:
                print(f"third_party_leaks: unknown script {name!r}", file=sys.stderr)
                return 2
            repo = args.repos / SCRIPTS[name].repo
            if not repo.is_dir():
                print(f"{name:17} skipped: no clone at {repo}")
                continue
            for leak in (True, False):
                bad += not _run(name, SCRIPTS[name], repo, Path(tmp), leak)
    print(f"{bad} run(s) with a missed, withdrawn, misplaced or false verdict")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
