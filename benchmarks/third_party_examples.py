"""Issue 36's leaks and advice on pytorch/examples scripts, at DEFAULT options.

Five scripts of pytorch/examples, each run as it is (a copy, tiny local data, nothing
downloaded) and with one of the leaks real code makes injected (a few lines added to the copy):

* vae: an exception kept with its traceback (``errors.append(e)`` after a check that raises inside
  a helper holding tensors, on about a third of the steps: the data decides);
* mnist: a forward hook registered inside the loop, each stashing a copy of fc1's output (the
  leak accelerates; the hooks are its cause); its DataLoader applies a Normalize module;
* dcgan (``--dataset fake``): a logger thread that takes what the loop puts on a queue.Queue, slower
  than the loop puts it (a fixed pause an item: the queue grows whatever memscope's pauses);
* word_language_model (Transformer): a ``functools.lru_cache(maxsize=None)`` function returning a
  new tensor per batch offset;
* gcn: a list keeping a sparse copy of the features every epoch (sparse tensors).

For each it prints the case table: whether the leak was reported (from which step, ever withdrawn),
the holder and storing line at the end, and its bytes per step against tests/leaktruth/truth.py's
count without memscope (``rate vs truth``; vae's, a leak on some steps only: from each group's
first rise to memscope's last inventory); each clean run must report nothing from step 20 on.
Then the advice-accuracy table of the clean runs: each suggestion's figure against what
``memscope whatif`` measures (mixed_precision, activation_checkpointing, lighter_optimizer),
as benchmarks/advice_accuracy.py prints it.

torchvision is not installed here: a stub of the few parts the scripts use is written beside
them (MNIST and FakeData of random images, ToTensor, Normalize (an nn.Module, as torchvision's),
Compose, Resize, CenterCrop, save_image that saves nothing).

    .venv/bin/python benchmarks/third_party_examples.py                 # finds the clone itself
    .venv/bin/python benchmarks/third_party_examples.py --examples DIR vae gcn --no-advice

``--examples DIR``: a checkout of https://github.com/pytorch/examples; without it, the fetch
tool's mirror (/work/.mirror/pytorch+examples/repo, a git directory) is read with ``git archive``.
Exits 1 when a leak is missed, withdrawn, misplaced or off its truth by more than 20%, a clean
run reports one, or a run fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from third_party_leaks import _edit, _verdicts  # noqa: E402

MIRROR = Path("/work/.mirror/pytorch+examples/repo")
TRUTH = ROOT / "tests" / "leaktruth" / "truth.py"
RATE_TOLERANCE = 0.2  # a leak's bytes per step against the truth (the sporadic and timed ones vary)

_TORCHVISION = {
    "__init__.py": "from . import datasets, transforms, utils  # noqa: F401\n",
    "utils.py": "def save_image(*args, **kwargs):\n    pass  # a stub: nothing saved\n",
    "transforms.py": '''import torch
import torch.nn as nn


class Compose:
    def __init__(self, ts):
        self.ts = ts

    def __call__(self, x):
        for t in self.ts:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, x):
        return x.float().div(255) if x.dtype == torch.uint8 else x


class Normalize(nn.Module):  # torchvision's Normalize is an nn.Module
    def __init__(self, mean, std):
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x):
        m = torch.tensor(self.mean).view(-1, 1, 1)
        s = torch.tensor(self.std).view(-1, 1, 1)
        return (x - m) / s


class Resize:
    def __init__(self, size):
        self.size = size

    def __call__(self, x):
        return x


CenterCrop = Resize
''',
    "datasets.py": '''import torch


class _Images(torch.utils.data.Dataset):
    def __init__(self, n, shape, classes, transform, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.transform = transform

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i]
        return (self.transform(x) if self.transform else x), int(self.y[i])


def MNIST(root, train=True, download=False, transform=None):
    return _Images(512 if train else 128, (1, 28, 28), 10, transform, 0 if train else 1)


def FakeData(size=1000, image_size=(3, 64, 64), num_classes=10, transform=None, **kwargs):
    return _Images(min(size, 256), image_size, num_classes, transform, 2)
''',
}


def _stub_torchvision(copy: Path) -> None:
    d = copy / "torchvision"
    d.mkdir()
    for name, text in _TORCHVISION.items():
        (d / name).write_text(text)


def _prepare_gcn(copy: Path) -> None:
    """A small random graph in cora's files (300 papers, 64 binary features, 7 classes)."""
    import numpy as np

    rng = np.random.default_rng(0)
    cora = copy / "cora"
    cora.mkdir()
    with open(cora / "cora.content", "w") as f:
        for i in range(300):
            feats = (rng.random(64) < 0.15).astype(int)
            feats[rng.integers(64)] = 1
            f.write("\t".join([str(1000 + i), *map(str, feats), f"class{rng.integers(7)}"]) + "\n")
    with open(cora / "cora.cites", "w") as f:
        for _ in range(900):
            a, b = rng.integers(300, size=2)
            f.write(f"{1000 + a}\t{1000 + b}\n")


def _prepare_wlm(copy: Path) -> None:
    """A tiny corpus in wikitext-2's files: sentences of 500 made-up words (about 12k tokens of
    training text)."""
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(500)]
    data = copy / "data" / "wikitext-2"
    data.mkdir(parents=True, exist_ok=True)
    for name, lines in (("train.txt", 800), ("valid.txt", 80), ("test.txt", 80)):
        text = "".join(" ".join(rng.choices(words, k=rng.randint(5, 25))) + " .\n" for _ in range(lines))
        (data / name).write_text(text, encoding="utf-8")


@dataclass
class Example:
    folder: str
    script: str
    args: list[str]
    leak: list[tuple[str, str]]  # (anchor, replacement) for the leak run
    held_by: str  # the holder at the end (a prefix where a search may name one of equal paths)
    stored: str  # the storing line's text (its number is found in the copy)
    truth_steps: tuple[int, int] = (20, 60)
    common: list[tuple[str, str]] = field(default_factory=list)  # edits both runs need
    prepare: Callable[[Path], None] | None = None
    rate_tolerance: float | None = RATE_TOLERANCE  # None: not compared (a leak that accelerates)
    optimizers: int = 1  # optimizer steps an iteration (the truth counts optimizer steps)
    # a leak on some steps only: the truth over each group's span, from its first rise (found by
    # the truth in walks after every step) to memscope's last inventory, as memscope measures
    # it; not over truth_steps: 80 steps of a leak the data decides hold more or fewer
    # occurrences than the run (33 in steps 21-100 of the vae, 25 at the whole run's rate)
    sporadic: bool = False


EXAMPLES: dict[str, Example] = {
    "vae": Example(
        "vae", "main.py", ["--batch-size", "8", "--epochs", "3", "--no-accel"],
        [("def train(epoch):\n",
          "errors = []\n"
          "draws = __import__('random').Random(36)\n\n\n"
          "def check_finite(recon, mu):\n"
          "    scaled = mu * 2.0  # a local of the helper that raises: its traceback keeps it\n"
          "    if draws.random() < 0.35:  # the data decides: about a third of the steps\n"
          "        raise ValueError('latent out of range')\n"
          "    return scaled\n\n\n"
          "def train(epoch):\n"),
         ("        loss = loss_function(recon_batch, data, mu, logvar)\n",
          "        loss = loss_function(recon_batch, data, mu, logvar)\n"
          "        try:\n"
          "            check_finite(recon_batch, mu)\n"
          "        except ValueError as e:\n"
          "            errors.append(e)\n")],
        "__main__.errors[*].__traceback__.", "errors.append(e)", sporadic=True),
    "mnist": Example(
        "mnist", "main.py", ["--batch-size", "16", "--epochs", "3", "--no-accel", "--log-interval", "1000"],
        [("def train(args, model, device, train_loader, optimizer, epoch):\n",
          "kept = []\n\n\n"
          "def keep(module, inputs, output):\n"
          "    kept.append(output.detach().clone())\n\n\n"
          "def train(args, model, device, train_loader, optimizer, epoch):\n"),
         ("        optimizer.zero_grad()\n        output = model(data)\n",
          "        optimizer.zero_grad()\n"
          "        model.fc1.register_forward_hook(keep)\n"
          "        output = model(data)\n")],
        "__main__.kept", "kept.append(output", truth_steps=(10, 30), rate_tolerance=None),  # accelerates
    "dcgan": Example(
        "dcgan", "main.py", ["--dataset", "fake", "--batchSize", "8", "--imageSize", "64", "--ngf", "8",
                             "--ndf", "8", "--niter", "4", "--workers", "0", "--outf", "out"],
        [("for epoch in range(opt.niter):\n",
          "import queue, threading, time\n"
          "log_queue = queue.Queue()\n\n\n"
          "def logger():\n"
          "    while True:\n"
          "        log_queue.get()\n"
          "        time.sleep(2.0)  # writes a sample: slower than the loop puts them\n\n\n"
          "threading.Thread(target=logger, daemon=True).start()\n"
          "for epoch in range(opt.niter):\n"),
         ("        optimizerG.step()\n",
          "        optimizerG.step()\n        log_queue.put(fake.detach())\n")],
        "__main__.log_queue.queue", "log_queue.put(", truth_steps=(20, 60), rate_tolerance=0.5, optimizers=2),
    "word_language_model": Example(
        "word_language_model", "main.py",
        # --lr: the example's default (20) is for its plain SGD; AdamW diverges there (the
        # validation loss's exp() overflows and the script exits 1, without memscope too)
        ["--model", "Transformer", "--use-optimizer", "--lr", "0.001", "--emsize", "32", "--nhid", "32",
         "--nlayers", "1", "--nhead", "2",
         "--epochs", "3", "--bptt", "20", "--batch_size", "8", "--log-interval", "1000", "--save", "m.pt"],
        [("def train():\n",
          "import functools\n\n\n"
          "@functools.lru_cache(maxsize=None)\n"
          "def position_bias(i):\n"
          "    return torch.full((args.bptt, args.emsize), float(i))  # a new tensor per offset\n\n\n"
          "def train():\n"),
         ("        data, targets = get_batch(train_data, i)\n",
          "        data, targets = get_batch(train_data, i)\n        position_bias(epoch * 10 ** 6 + i)\n")],
        "__main__.position_bias<lru_cache maxsize=None", "position_bias(epoch", truth_steps=(10, 40)),
    "gcn": Example(
        "gcn", "main.py", ["--epochs", "200", "--no-accel"],
        [("def train_iter(epoch, model, optimizer, criterion, input, target, mask_train, mask_val, print_every=10):\n",
          "kept = []\n\n\n"
          "def train_iter(epoch, model, optimizer, criterion, input, target, mask_train, mask_val, print_every=10):\n"),
         ("    optimizer.step()\n", "    optimizer.step()\n    kept.append(input[0] * 1.0)  # sparse\n")],
        "__main__.kept", "kept.append(input[0]", truth_steps=(20, 60),
        common=[("import requests\n", ""),  # not installed here; the download is replaced below
                ("    with requests.get(cora_url, stream=True) as tgz_file:\n"
                 "        with tarfile.open(fileobj=tgz_file.raw, mode='r:gz') as tgz_object:\n"
                 "            tgz_object.extractall()\n",
                 "    pass  # the benchmark wrote ./cora\n")],
        prepare=_prepare_gcn),
}


def _extract(src: Path | None, folders: list[str], dest: Path) -> Path:
    """pytorch/examples' folders under ``dest``: copied from a checkout, or read from the fetch
    tool's mirror (a git directory without a work tree) with git archive."""
    if src is not None:
        for f in folders:
            shutil.copytree(src / f, dest / f)
        return dest
    if not MIRROR.is_dir():
        raise SystemExit(f"third_party_examples: no --examples DIR and no mirror at {MIRROR}")
    dest.mkdir(parents=True, exist_ok=True)
    # the mirror leaves its largest files out (word_language_model's wikitext-2): the data is
    # written here anyway, so only the code is taken
    paths = [f":(glob){f}/*.py" for f in folders] + [":(glob)vae/results/*" for f in folders if f == "vae"]
    archive = subprocess.run(["git", "--git-dir", str(MIRROR / ".git") if (MIRROR / ".git").is_dir()
                              else str(MIRROR), "archive", "HEAD", *paths], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def _copy(tree: Path, ex: Example, tmp: Path, label: str, leak: bool) -> Path:
    copy = tmp / f"{ex.folder}-{label}"
    shutil.copytree(tree / ex.folder, copy)
    _stub_torchvision(copy)
    (copy / "out").mkdir(exist_ok=True)
    if ex.prepare:
        ex.prepare(copy)
    if ex.folder == "word_language_model":
        _prepare_wlm(copy)
    target = copy / ex.script
    if ex.common:
        _edit(target, ex.common)
    if leak:
        _edit(target, ex.leak)
    return copy


def _truth_sporadic(copy: Path, ex: Example, keys: set[str], last: int) -> float | None:
    """Bytes (tensors and what their graphs save) each group of ``keys`` kept per step from the
    walk before its first rise to step ``last``, summed, by a plain run (walks after every step
    from 1: its first rise after memscope's warm-up)."""
    out = copy / "truth.json"
    walk_at = f"1-{last}"
    done = subprocess.run([sys.executable, str(TRUTH), "--at", str(out), walk_at, ex.script, *ex.args],
                          cwd=copy, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.exists():
        print(f"    (truth failed: {done.stderr.strip().splitlines()[-1:]})")
        return None
    doc = json.loads(out.read_text())
    steps, total = doc["steps"], 0.0
    for k in keys:
        walks = doc["groups"].get(k)
        kept = [w[1] + w[3] for w in walks] if walks else []
        rise = next((i for i in range(1, len(kept)) if kept[i] > kept[i - 1]), None)
        if rise is None:
            print(f"    (truth: {k} never grew)")
            return None
        rate = (kept[-1] - kept[rise - 1]) / (last - steps[rise - 1])
        print(f"    truth: {k} from step {steps[rise - 1]} to {last}: {rate:.1f} B/step")
        total += rate
    return total * ex.optimizers


def _truth(copy: Path, ex: Example, keys: set[str]) -> float | None:
    """Bytes (tensors and what their graphs save) the groups ``keys`` (``"[8, 784]|float32|
    SigmoidBackward0"``: the leak's) kept per step between the truth's two steps, by a plain
    run (tests/leaktruth/truth.py: no memscope)."""
    a, b = ex.truth_steps
    out = copy / "truth.json"
    done = subprocess.run([sys.executable, str(TRUTH), str(out), str(a), str(b), ex.script, *ex.args],
                          cwd=copy, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.exists():
        print(f"    (truth failed: {done.stderr.strip().splitlines()[-1:]})")
        return None
    groups = json.loads(out.read_text())["groups"]
    per_optimizer_step = sum((g[1][1] - g[0][1]) + (g[1][3] - g[0][3])
                             for k, g in groups.items() if k in keys) / (b - a)
    return per_optimizer_step * ex.optimizers  # memscope's steps are iterations (its first optimizer's)


@dataclass
class Outcome:
    name: str
    leak: bool
    ok: bool
    cells: list[str]


def _attach(copy: Path, ex: Example) -> tuple[subprocess.CompletedProcess[str], Path, float]:
    db = copy / "run.db"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db), ex.script,
                          *ex.args], cwd=copy, capture_output=True, text=True, timeout=3600)
    return out, db, time.perf_counter() - t0


def run_leak(name: str, ex: Example, tree: Path, tmp: Path) -> Outcome:
    copy = _copy(tree, ex, tmp, "leak", True)
    out, db, wall = _attach(copy, ex)
    if out.returncode != 0:
        return Outcome(name, True, False, [name, "leak", f"run failed ({out.returncode}): "
                                           f"{out.stderr.strip().splitlines()[-1:]}", "", "", "", ""])
    steps, leaks_at = _verdicts(db)
    report = json.loads(subprocess.run([sys.executable, "-m", "memscope", "report", "--json", str(db)], cwd=copy,
                                       capture_output=True, text=True, check=True).stdout)

    def mine(lks: list[Any], key: Callable[[Any], str | None]) -> list[Any]:
        return [lk for lk in lks if (key(lk) or "").startswith(ex.held_by)]

    hit = {st: mine(leaks_at(st), lambda lk: lk.held_by) for st in steps}
    first = next((st for st in steps if hit[st]), None)
    withdrawn = [st for st in steps if first is not None and st > first and not hit[st]]
    verdict = json.loads(subprocess.run([sys.executable, "-m", "memscope", "leaks", "--json", str(db)], cwd=copy,
                                        capture_output=True, text=True, check=True).stdout)
    end = mine(verdict["leaks"], lambda lk: lk["held_by"])  # (leaks --json has each one's grad_fn)
    lines = (copy / ex.script).read_text().splitlines()
    stored = f"{ex.script}:{next(i + 1 for i, ln in enumerate(lines) if ln.strip().startswith(ex.stored))}"
    keys = {f"{lk['shape']}|{lk['dtype']}|{lk.get('grad_fn')}" for lk in end}
    truth = _truth_sporadic(copy, ex, keys, max(steps)) if ex.sporadic and end else _truth(copy, ex, keys)
    rate = sum(lk["bytes_per_step"] - lk["graph_nodes_per_step"] * lk["node_bytes"] for lk in end)
    ratio = rate / truth if truth else None
    sites = sorted({str(lk.get("site")) for lk in end})
    ok = first is not None and not withdrawn and bool(end) and sites == [stored] and (
        ex.rate_tolerance is None or (ratio is not None and abs(ratio - 1) <= ex.rate_tolerance))
    hooks = report.get("hook_growth") or []
    extra = f"; hooks: {hooks[0]['module']} {hooks[0]['kind']} +{hooks[0]['hooks_per_step']}/step at " \
            f"{hooks[0]['site']}" if hooks else ""
    accel = "; accelerating" if any(lk.get("accelerating") for lk in end) else ""
    return Outcome(name, True, ok, [
        name, f"leak, {report['run']['steps']} steps, {wall:.0f} s",
        f"from step {first}" + (f", WITHDRAWN at {withdrawn[:3]}" if withdrawn else ", never withdrawn")
        if first is not None else "NOT FOUND",
        ", ".join(sorted({str(lk['held_by']) for lk in end})) or "-",
        f"{', '.join(sites)} (want {stored})" if sites != [stored] else stored,
        f"{rate / 1024:.2f} KiB vs {truth / 1024:.2f} KiB ({(ratio - 1) * 100:+.0f}%)" if truth and ratio else "-",
        (f"{len(end)} group(s)" + accel + extra)])


def run_clean(name: str, ex: Example, tree: Path, tmp: Path) -> tuple[Outcome, Path | None]:
    copy = _copy(tree, ex, tmp, "clean", False)
    out, db, wall = _attach(copy, ex)
    if out.returncode != 0:
        return Outcome(name, False, False, [name, "clean", f"run failed ({out.returncode}): "
                                            f"{out.stderr.strip().splitlines()[-1:]}", "", "", "", ""]), None
    steps, leaks_at = _verdicts(db)
    wrong = [st for st in steps if st >= 20 and leaks_at(st)]
    report = json.loads(subprocess.run([sys.executable, "-m", "memscope", "report", "--json", str(db)], cwd=copy,
                                       capture_output=True, text=True, check=True).stdout)
    ok = not wrong and not report["leaks"] and not report.get("hook_growth")
    return Outcome(name, False, ok, [
        name, f"clean, {report['run']['steps']} steps, {wall:.0f} s",
        "no leak" if not wrong else f"FALSE LEAK at steps {wrong[:5]}",
        ", ".join(str(lk["held_by"]) for lk in report["leaks"]) or "-", "-", "-",
        f"hotspots: {', '.join(h['module'] or '(model)' for h in report['hotspots'][:3])}"]), copy


def advice_rows(name: str, ex: Example, copy: Path) -> list[Any]:
    """benchmarks/advice_accuracy.py's rows for the clean script: whatif's baseline and trials
    (run in the copy, where the script's data is)."""
    import advice_accuracy as aa

    work = copy / "whatif"
    work.mkdir()
    case = aa.Case(name, copy / ex.script, ex.args)
    cmd = [sys.executable, "-m", "memscope", "whatif", "--json", "--steps", str(aa.STEPS), "--db-dir", str(work),
           "--try", ",".join(aa.MEASURED_BY_WHATIF), ex.script, *ex.args]
    done = subprocess.run(cmd, cwd=copy, capture_output=True, text=True, timeout=3600)
    if done.returncode not in (0, 1):
        print(f"    {name}: whatif failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
        return []
    return aa.analyse(case, str(work), aa._trials(case, str(work)))


def table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=Path, help="a checkout of pytorch/examples (default: the fetch mirror)")
    ap.add_argument("--no-advice", action="store_true", help="the case table only")
    ap.add_argument("names", nargs="*", help=f"a subset of: {', '.join(EXAMPLES)}")
    args = ap.parse_args()
    names = args.names or list(EXAMPLES)
    for n in names:
        if n not in EXAMPLES:
            print(f"third_party_examples: unknown example {n!r}", file=sys.stderr)
            return 2
    outcomes: list[Outcome] = []
    advice: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="third-party-examples-") as tmp_name:
        tmp = Path(tmp_name)
        tree = _extract(args.examples, sorted({EXAMPLES[n].folder for n in names}), tmp / "examples")
        for name in names:
            ex = EXAMPLES[name]
            outcomes.append(run_leak(name, ex, tree, tmp))
            print(" | ".join(outcomes[-1].cells), flush=True)
            clean, copy = run_clean(name, ex, tree, tmp)
            outcomes.append(clean)
            print(" | ".join(clean.cells), flush=True)
            if copy is not None and not args.no_advice:
                advice += advice_rows(name, ex, copy)
    print()
    print(table(["script", "run", "found", "held by", "stored at", "rate vs truth", "also"],
                [o.cells for o in outcomes]))
    bad = sum(not o.ok for o in outcomes)
    if advice:
        import advice_accuracy as aa

        print()
        print(aa.markdown(advice))
        bad += sum(not r.ok for r in advice)
    print(f"\n{bad} case(s) or figure(s) off")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
