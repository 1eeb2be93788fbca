"""``memscope whatif --try fix_leak SCRIPT``: find the leaks, patch the lines that stored them in a
copy of the script, rerun the copy, and measure what the fix saves. The user's files are read,
never written: the copy lives in the run files' directory, and the script's own directory stays
on ``sys.path`` behind it (its sibling modules import as before; one of them that holds a storing
line is copied, patched, beside the script and found first)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from memscope.analysis.hooks import HookGrowth
from memscope.analysis.leak_patch import Edit, Plan, plan_fix, plan_hoist, split_site
from memscope.analysis.leaks import Leak
from memscope.analysis.node_cost import node_cost
from memscope.analysis.summary import summarize
from memscope.analysis.whatif import Measure, measure
from memscope.runners.script_estimate import ChildRun, run_recorded
from memscope.safe_files import make_dir, output
from memscope.store.reader import RunReader

MIN_STEPS = 12  # a leak is reported with its storing line by step 7


@dataclass
class Patched:
    leak: Leak | None  # a leak, or hooks registered again and again (``hook``)
    path: str | None = None  # the file patched (as in the site), None: not patched
    line: int = 0
    old: str = ""
    new: str = ""
    why: str = ""
    hook: HookGrowth | None = None

    @property
    def site(self) -> str | None:
        return self.leak.site if self.leak is not None else self.hook.site if self.hook else None


@dataclass
class FixLeakTrial:
    steps: int
    baseline: Measure
    trial: Measure | None
    patched: list[Patched] = field(default_factory=list)
    after: list[Leak] = field(default_factory=list)  # leaks of the patched run
    after_hooks: list[HookGrowth] = field(default_factory=list)  # hooks growing in the patched run
    kept_before: int | None = None  # what the last inventory saw alive (tensors, graphs, nodes)
    kept_after: int | None = None
    copy: str | None = None  # the patched script
    note: str | None = None

    def gone(self, lk: Leak | None, hook: HookGrowth | None = None) -> bool:
        if hook is not None:
            return not any(h.module == hook.module and h.kind == hook.kind for h in self.after_hooks)
        return lk is not None and not any(a.held_by == lk.held_by and a.shape == lk.shape
                                          and a.grad_fn == lk.grad_fn for a in self.after)

    def as_json(self) -> dict[str, Any]:
        def saving(a: int | None, b: int | None) -> int | None:
            return a - b if a is not None and b is not None else None

        return {"technique": "fix_leak", "steps": self.steps, "copy": self.copy, "note": self.note,
                "patches": [{"held_by": p.leak.held_by, "site": p.leak.site, "bytes_per_step": p.leak.bytes_per_step,
                             "patched": p.path is not None, "old": p.old.rstrip("\n") or None,
                             "new": p.new or None, "why": p.why, "gone": self.gone(p.leak) if self.trial else None}
                            for p in self.patched if p.leak is not None],
                # additive: hooks registered again and again, registered once before their loop
                "hook_patches": [{"module": p.hook.module, "kind": p.hook.kind, "site": p.hook.site,
                                  "hooks_per_step": p.hook.per_step, "patched": p.path is not None,
                                  "old": p.old.rstrip("\n") or None, "new": p.new or None, "why": p.why,
                                  "gone": self.gone(None, p.hook) if self.trial else None}
                                 for p in self.patched if p.hook is not None],
                "kept_before": self.kept_before, "kept_after": self.kept_after,
                "tensor_peak_before": self.baseline.tensor_peak,
                "tensor_peak_after": self.trial.tensor_peak if self.trial else None,
                "measured_saving_bytes": saving(self.baseline.tensor_peak,
                                                self.trial.tensor_peak if self.trial else None)}


def try_fix_leak(script: str, script_args: Sequence[str], workdir: str, steps: int,
                 options: dict[str, Any], group_readable: bool = False) -> tuple[FixLeakTrial | None, ChildRun]:
    """Baseline, patch, trial. Returns (None, the failed run) when a run fails. The patched
    copies go to ``WORKDIR/fix_leak/`` (memscope's names: made the safe way, 0600 or 0640)."""
    steps = max(steps, MIN_STEPS)
    opts = {**options, "max_steps": steps}
    stem = os.path.splitext(os.path.basename(script))[0]
    base = run_recorded(script, script_args, os.path.join(workdir, f"whatif-{stem}-baseline.db"), opts,
                        group_readable=group_readable)
    if not base.ok:
        return None, base
    with RunReader(base.db) as reader:
        baseline = measure(reader)
        s = summarize(reader)
        leaks, hooks = s.leaks, s.hooks
        kept = last_inventory_bytes(reader)
    result = FixLeakTrial(steps, baseline, None, kept_before=kept)
    if not leaks and not hooks:
        result.note = f"no leak found in {steps} steps: nothing to fix"
        return result, base
    shadow = os.path.join(workdir, "fix_leak")
    make_dir(shadow, group_readable)
    home = os.path.dirname(os.path.abspath(script))
    originals: dict[str, list[str]] = {}  # absolute path of a file -> its lines
    copies: dict[str, list[Edit]] = {}  # absolute path of a file -> the edits of its copy
    todo = [Patched(lk) for lk in leaks] + [Patched(None, hook=h) for h in hooks]
    for p in todo:
        result.patched.append(p)
        where = split_site(p.site) if p.site else None
        if where is None:
            p.why = "the line that " + ("stored it" if p.leak is not None else "registered them") + " is not known"
            continue
        path, line = where
        full = os.path.abspath(path)
        if os.path.dirname(full) != home:
            p.why = f"{path} is not beside the script: patch it by hand (memscope leaks --diff)"
            continue
        lines = originals.get(full)
        if lines is None:
            try:
                with open(full, encoding="utf-8") as f:
                    lines = originals[full] = f.readlines()
            except (OSError, UnicodeDecodeError) as exc:
                p.why = f"cannot read {path}: {type(exc).__name__}"
                continue
        plan, why = plan_fix(lines, line, p.leak) if p.leak is not None else plan_hoist(lines, line)
        p.why = why
        if plan is None:
            continue
        edits = copies.setdefault(full, [])
        taken = {(e.line, e.count) for e in edits}
        if any((e.line, e.count) in taken for e in plan.edits):
            if not all(e in edits for e in plan.edits):
                p.why = "another leak's fix changes that line: patch it by hand (memscope leaks --diff)"
                continue
            p.why = "the same change as for the leak above (one line stored both): " + why
        else:
            edits.extend(plan.edits)
        p.path, p.line, p.old, p.new = path, plan.line, plan.old_text(lines), plan.new_text()
    if not copies:
        result.note = "no storing line could be patched"
        return result, base
    copy = os.path.join(shadow, os.path.basename(script))
    with open(script, "rb") as src, output(copy, "whatif:", named=False, group_readable=group_readable,
                                            binary=True) as f:
        f.write(src.read())
    for full, edits in copies.items():
        with output(os.path.join(shadow, os.path.basename(full)), "whatif:", named=False,
                    group_readable=group_readable) as f:
            f.writelines(Plan(edits, "").apply(originals[full]))
    result.copy = copy
    trial = run_recorded(copy, script_args, os.path.join(workdir, f"whatif-{stem}-fix_leak.db"), opts,
                         extra_path=home, group_readable=group_readable)
    if not trial.ok:
        return None, trial
    with RunReader(trial.db) as reader:
        result.trial = measure(reader)
        after = summarize(reader)
        result.after, result.after_hooks = after.leaks, after.hooks
        result.kept_after = last_inventory_bytes(reader)
    return result, trial


def last_inventory_bytes(reader: RunReader) -> int | None:
    """What the run's last tensor inventory saw alive: tensor bytes, the bytes its graphs saved
    and their nodes (at what a node cost on that run, or the estimate), the measure a leak grows."""
    rows = reader.query("SELECT proc, bytes, graph_bytes, graph_nodes FROM inventories ORDER BY step DESC LIMIT 1")
    if not rows:
        return None
    r = rows[0]
    each = node_cost(reader, int(r["proc"])).bytes
    return int(r["bytes"] or 0) + int(r["graph_bytes"] or 0) + int(r["graph_nodes"] or 0) * each
