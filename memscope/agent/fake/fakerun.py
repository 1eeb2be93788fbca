"""A fake run: the user's unchanged script, its first steps, under FakeTensorMode.

``python -m memscope.agent.fake.fakerun`` is started by memscope.runners.fake_estimate. It imports
torch once, then reads one JSON request per line on stdin; for each it forks a child that runs
the script as ``python SCRIPT ARGS`` would (same ``sys.argv``, ``sys.path[0]``, ``__main__``,
working directory), with

* every tensor created under ``FakeTensorMode``: shapes, dtypes and strides, no memory, so a
  7B model "trains" on a laptop;
* a pretend CUDA GPU when the machine has none (memscope.agent.fake.fake_cuda);
* the accounting of memscope.agent.fake.fake_ledger, step boundaries as the agent finds them (the
  first optimizer's ``step()``; without an optimizer, the outermost backward), and the end of
  the run after the requested number of steps (a ``BaseException`` raised from the boundary,
  which ``except Exception`` in the script does not catch);
* every file the script writes, renames or removes diverted to a scratch directory
  (memscope.agent.fake.fake_files): a fake run changes none of the user's files;
* optionally the techniques ``whatif`` applies (memscope.agent.whatif.techniques) or a checkpointing
  plan that names its blocks, and a DataLoader batch size.

The child writes its figures as JSON to the request's ``result`` path and its output (the
script's prints) to ``log``; the parent answers ``{"id": ..., "status": exit status}`` on stdout.
Forking from a process that already imported torch makes each trial of ``memscope fit`` cost
the script's own work only.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import runpy
import sys
import tempfile
import time
import traceback
import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memscope.agent.runtime.config import AgentOptions
from memscope.agent.fake.fake_files import Sandbox
from memscope.agent.fake.fake_ledger import Accounting, Ledger
from memscope.safe_files import output, replace_new
from memscope.agent.torchcompat.optimizer_state import optimizer_state_tensors

DEFAULT_GPU = 80 << 30  # what the pretend GPU says it has when the request names no size


class Enough(BaseException):
    """Raised at the boundary that completed the requested steps: ends the script."""


class _Host:
    """What memscope.agent.whatif.techniques asks of the agent: options, and events to keep."""

    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        self.events: list[dict[str, Any]] = []

    def event(self, kind: str, message: str, data: Any = None) -> None:
        self.events.append({"kind": kind, "message": message, "data": data})


class FakeRun:
    def __init__(self, req: dict[str, Any]) -> None:
        self.req = req
        self.script = os.path.abspath(req["script"])
        self.want_steps = int(req.get("steps") or 2)
        self.ledger = Ledger()
        self.accounting = Accounting(self.ledger, self.script)
        self.steps: list[dict[str, Any]] = []
        self.optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.roots: list[Any] = []  # outermost modules called, first first
        self.names: dict[int, str] = {}  # id(module) -> name
        self.stack: list[str] = []
        self.mode: str | None = None  # "optimizer" or "backward"
        self.clock: Any = None
        self.backward_depth = 0
        self.parsers: list[dict[str, Any]] = []
        self.loader_batches: list[int] = []
        self.block_inputs: dict[str, int] = {}
        self.block_names: frozenset[str] = frozenset()
        self.block_list: list[str] = []
        self.block_container = ""
        self.main: Any = None  # the model: the first outermost module with parameters
        sac = req.get("sac_save")
        self.host = _Host(AgentOptions.from_mapping(
            {"try_techniques": [t for t in req.get("techniques", []) if t != "activation_checkpointing"]
             + (["activation_checkpointing"] if req.get("checkpoint_blocks") == "*" else [])
             + (["selective_checkpointing"] if isinstance(sac, list) else []),
             "sac_save": sac if isinstance(sac, list) else None, "sac_profile": bool(req.get("sac_profile"))}))
        self.checkpoint_names = req.get("checkpoint_blocks") if isinstance(req.get("checkpoint_blocks"), list) else None
        self.totals = {"parameters": 0, "gradients": 0, "optimizer_state": 0}
        self.optimizer_names: list[str] = []
        work = os.path.dirname(os.path.abspath(req["result"]))
        # a new private directory (0700, a name no one can plant ahead), in --db-dir too
        scratch = req.get("scratch") or tempfile.mkdtemp(prefix=f"files-{req.get('id', 0)}-", dir=work)
        self.sandbox = Sandbox(scratch,
                               [work, os.path.dirname(os.path.abspath(req.get("log") or req["result"]))])

    # -- boundaries ------------------------------------------------------------------------------

    def close(self) -> None:
        figures = self.ledger.close_step()
        figures["step"] = len(self.steps)
        self.totals = self._states()
        figures.update(self.totals)
        self.optimizer_names = sorted({type(o).__name__ for o in list(self.optimizers)})
        self.steps.append(figures)
        if len(self.steps) >= self.want_steps:
            raise Enough()

    def _params(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for opt in list(self.optimizers):
            for group in opt.param_groups:
                for p in group["params"]:
                    out[id(p)] = p
        for root in self.roots:
            for p in root.parameters():
                out[id(p)] = p
        return out

    def _states(self) -> dict[str, int]:
        seen: set[int] = set()
        totals = {"parameters": 0, "gradients": 0, "optimizer_state": 0}

        def count(t: Any, category: str) -> None:
            serial = self.ledger.serial_of(t)
            n = self.ledger.claim(t, category)
            key = serial if serial is not None else id(t)
            if key not in seen:
                seen.add(key)
                totals[category] += n

        params = self._params()
        for p in params.values():
            count(p, "parameters")
        for p in params.values():
            if p.grad is not None:
                count(p.grad, "gradients")
        for v in optimizer_state_tensors(self.optimizers):
            count(v, "optimizer_state")
        return totals

    def _claim_grads(self) -> None:
        for p in self._params().values():
            if p.grad is not None:
                self.ledger.claim(p.grad, "gradients")

    def _optimizer_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        self._claim_grads()

    def _optimizer_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.optimizers.add(opt)
        if self.mode == "backward":
            return
        self.mode = "optimizer"
        if self.clock is None or self.clock() is None:
            self.clock = weakref.ref(opt)
        if self.clock() is opt:
            self.close()

    def _wrap_backward(self) -> None:
        orig = torch.autograd.backward
        run = self

        @functools.wraps(orig)
        def backward(*args: Any, **kwargs: Any) -> Any:
            run.backward_depth += 1
            try:
                return orig(*args, **kwargs)
            finally:
                run.backward_depth -= 1
                if run.backward_depth == 0:
                    run._claim_grads()
                    if run.mode is None:
                        run.mode = "optimizer" if len(run.optimizers) else "backward"
                    if run.mode == "backward":
                        run.close()

        torch.autograd.backward = backward

    def _watch_optimizers(self) -> None:
        orig = torch.optim.Optimizer.__init__
        run = self

        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            run.optimizers.add(self)

        torch.optim.Optimizer.__init__ = __init__  # type: ignore[method-assign]
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(self._optimizer_pre)
        register_optimizer_step_post_hook(self._optimizer_post)

    # -- modules ---------------------------------------------------------------------------------

    def _name(self, module: Any) -> str:
        name = self.names.get(id(module))
        if name is None:
            if self.stack:
                name = f"{self.stack[-1]}.?{type(module).__name__}"
            else:
                self._new_root(module)
                name = self.names[id(module)]
        return name

    def _new_root(self, module: Any) -> None:
        """An outermost module: the first one with parameters is the model (named as
        ``named_modules`` names it, itself ""); others get their class as a prefix."""
        has_params = next(module.parameters(), None) is not None
        main = has_params and self.main is None
        prefix = "" if main else f"{type(module).__name__}:"
        self.roots.append(module)
        for n, m in module.named_modules():
            self.names.setdefault(id(m), prefix + n if n else prefix.rstrip(":"))
        for p in module.parameters():
            self.ledger.claim(p, "parameters")
        for b in module.buffers():
            serial = self.ledger.add(b)
            if serial is not None:
                self.ledger.buffers.add(serial)
        if main:
            self.main = module
            self._apply_checkpoint_plan(module)

    def _pre_hook(self, module: Any, args: Any) -> None:
        name = self._name(module)
        self.stack.append(name)
        if name in self.block_names and torch.is_grad_enabled() and name not in self.block_inputs:
            self.block_inputs[name] = sum(a.untyped_storage().nbytes() for a in args
                                          if isinstance(a, torch.Tensor))

    def _post_hook(self, module: Any, args: Any, output: Any) -> None:
        if self.stack:
            self.stack.pop()

    def _pack(self, t: Any) -> Any:
        return self.ledger.saved(t, self.stack[-1] if self.stack else "<no module>")

    def _apply_checkpoint_plan(self, root: Any) -> None:
        from memscope.agent.whatif.techniques import choose_blocks

        container, blocks = choose_blocks(root)
        self.block_container = container
        self.block_names = frozenset(self.names[id(b)] for b in blocks)
        self.block_list = [self.names[id(b)] for b in blocks]
        if self.checkpoint_names is None:
            return
        from memscope.agent.whatif.techniques import _patch_class_forward

        chosen = [b for b in blocks if self.names[id(b)] in set(self.checkpoint_names)]

        def wrap(orig: Any, module: Any, args: Any, kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return orig(module, *args, **kwargs)
            return torch.utils.checkpoint.checkpoint(functools.partial(orig, module), *args,
                                                     use_reentrant=False, **kwargs)

        for b in chosen:
            _patch_class_forward(type(b), "activation_checkpointing", b, wrap)
        self.host.event("technique", f"activation_checkpointing: {len(chosen)} of {len(blocks)} blocks",
                        {"technique": "activation_checkpointing", "applied": bool(chosen),
                         "blocks": [self.names[id(b)] for b in chosen]})

    # -- the script's surroundings -----------------------------------------------------------------

    def _patch_argparse(self) -> None:
        orig = argparse.ArgumentParser.parse_known_args
        run = self

        @functools.wraps(orig)
        def parse_known_args(self: Any, args: Any = None, namespace: Any = None) -> Any:
            ns, rest = orig(self, args, namespace)
            try:
                opts = []
                for a in self._actions:
                    if not a.option_strings or a.dest == "help":
                        continue
                    opts.append({"options": list(a.option_strings), "dest": a.dest,
                                 "value": _plain(getattr(ns, a.dest, None)), "default": _plain(a.default)})
                run.parsers.append({"options": opts})
            except Exception:
                pass
            return ns, rest

        argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]

    def _patch_dataloader(self) -> None:
        import inspect

        from torch.utils.data import DataLoader

        orig = DataLoader.__init__
        sig = inspect.signature(orig)
        run = self
        override = self.req.get("dataloader_batch")

        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                bound = sig.bind(self, *args, **kwargs)
                a = bound.arguments
                # worker processes and pinned memory do not change GPU memory; fake tensors
                # cannot cross processes
                a["num_workers"] = 0
                a["pin_memory"] = False
                a["prefetch_factor"] = None
                a["persistent_workers"] = False
                if a.get("batch_sampler") is None:
                    size = a.get("batch_size", 1)
                    if isinstance(size, int):
                        run.loader_batches.append(size)
                        if override:
                            a["batch_size"] = int(override)
                args, kwargs = bound.args[1:], bound.kwargs
            except TypeError:
                pass
            orig(self, *args, **kwargs)

        DataLoader.__init__ = __init__  # type: ignore[method-assign]

    @staticmethod
    def _swap_fake_parameters() -> None:
        """``model.to(dtype)`` swaps each parameter with its converted copy
        (``torch.utils.swap_tensors``), which refuses tensors that have weakrefs, and
        FakeTensorMode keeps weakrefs to its tensors: such a swap falls back to ``.data =``,
        which keeps the Parameter object (the optimizer's) and takes the new fake data."""
        from torch._subclasses.fake_tensor import FakeTensor

        orig = torch.utils.swap_tensors

        @functools.wraps(orig)
        def swap_tensors(t1: Any, t2: Any) -> None:
            try:
                orig(t1, t2)
            except RuntimeError:
                if not (isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor)):
                    raise
                t1.data = t2.detach()

        torch.utils.swap_tensors = swap_tensors

    @staticmethod
    def _no_compile() -> None:
        def compile(model: Any = None, **kwargs: Any) -> Any:
            return (lambda m: m) if model is None else model

        torch.compile = compile
        torch.nn.Module.compile = lambda self, *a, **k: None  # type: ignore[method-assign]

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        req = self.req
        started = time.perf_counter()
        sys.argv = [req["script"], *req.get("args", [])]
        sys.path[0] = os.path.dirname(self.script)
        pretend = bool(req.get("pretend_cuda", True)) and not torch.cuda.is_available()
        cuda_mode = None
        if pretend:
            from memscope.agent.fake import fake_cuda

            gpu = self.ledger.devices.counter("cuda")  # torch.cuda's figures: GPU tensors only
            cuda_mode = fake_cuda.install(int(req.get("gpu_memory") or DEFAULT_GPU),
                                          lambda: gpu.total_rounded, lambda: gpu.peak_rounded,
                                          placement=self.ledger)
        self._no_compile()
        self._swap_fake_parameters()
        self.accounting.install_conversions()
        self._patch_argparse()
        self._patch_dataloader()
        self._watch_optimizers()
        self._wrap_backward()
        from torch.nn.modules import module as nn_module

        from memscope.agent.whatif import techniques

        techniques.install(self.host)  # type: ignore[arg-type]
        nn_module.register_module_forward_pre_hook(self._pre_hook)
        try:
            nn_module.register_module_forward_hook(self._post_hook, always_call=True)
        except TypeError:
            nn_module.register_module_forward_hook(self._post_hook)
        self.sandbox.install()
        status, error, code = "ok", None, 0
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        try:
            with fake, self.accounting:
                if cuda_mode is not None:
                    cuda_mode.__enter__()
                try:
                    with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                        runpy.run_path(self.script, run_name="__main__")
                finally:
                    if cuda_mode is not None:
                        cuda_mode.__exit__(None, None, None)
            status = "ended"  # the script ended before the steps were done
        except Enough:
            status = "ok"
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            status = "ended" if code == 0 else "exit"
            if code:
                error = f"the script exited with status {code}"
        except BaseException as exc:  # the script failed under the fake run: say where
            status, error = "error", _describe(exc, self.script)
            try:  # the whole traceback in the trial's log, which the error line points to
                traceback.print_exception(exc, file=sys.stderr)
            except Exception:
                pass
        if status == "ended" and len(self.steps) >= self.want_steps:
            status = "ok"
        return self.result(status, error, code, time.perf_counter() - started)

    def result(self, status: str, error: str | None, code: int, elapsed: float) -> dict[str, Any]:
        modules = []
        saved: dict[str, int] = {}
        for s in self.steps:
            saved = s.pop("saved_by_module", {}) or saved
        main = self.main
        if main is not None:
            for n, m in main.named_modules():
                name = self.names.get(id(m), n)
                nbytes = saved.get(name, 0)
                if nbytes or n == "" or name in self.block_names:
                    modules.append({"module": name, "type": type(m).__name__, "saved_bytes": nbytes,
                                    "param_bytes": sum(p.numel() * p.element_size() for p in m.parameters())})
        for name, nbytes in saved.items():
            if not any(m["module"] == name for m in modules):
                modules.append({"module": name, "type": None, "saved_bytes": nbytes, "param_bytes": 0})
        dtypes: dict[str, int] = {}
        for p in self._params().values():
            key = str(p.dtype).replace("torch.", "")
            dtypes[key] = dtypes.get(key, 0) + p.numel() * p.element_size()
        last = self.steps[-1] if self.steps else {}
        return {
            "schema": "memscope.fakerun/1",
            "status": status, "error": error, "exit_code": code,
            "steps": self.steps,
            "parameters": self.totals["parameters"], "gradients": self.totals["gradients"],
            "optimizer_state": self.totals["optimizer_state"],
            "activations": max((s["activations"] for s in self.steps), default=self.ledger.saved_peak),
            "peak_bytes": self.ledger.peak, "peak_rounded_bytes": self.ledger.peak_rounded,
            "uncounted_sparse": len(self.ledger.unsized_sparse),
            "peak_breakdown": self.ledger.peak_breakdown(),
            "peak_by_device": self.ledger.peak_by_device(),
            "flops": last.get("flops"),
            "modules": modules,
            "blocks": {"container": self.block_container, "names": self.block_list,
                       "inputs": self.block_inputs},
            "param_dtypes": dtypes,
            "optimizers": self.optimizer_names,
            "argparse": self.parsers,
            "dataloader_batches": self.loader_batches,
            "placeholders": [{"site": k, **v} for k, v in self.accounting.placeholders.items()],
            "techniques": [e["data"] for e in self.host.events
                           if isinstance(e.get("data"), dict) and e["kind"] == "technique"],
            "sac_profile": next((e["data"] for e in self.host.events if e["kind"] == "sac_profile"), None),
            "diverted": self.sandbox.listing(),
            "elapsed_s": round(elapsed, 3),
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }


def _plain(value: Any) -> Any:
    """A value JSON can carry as it is, else None."""
    return value if isinstance(value, (int, float, str, bool, type(None))) else None


def _describe(exc: BaseException, script: str) -> str:
    """One line: the exception and the innermost line of user code it came through."""
    site = None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        name = frame.filename
        if "/torch/" not in name and "/memscope/" not in name and not name.startswith("<"):
            site = f"{os.path.relpath(name) if not os.path.relpath(name).startswith('..') else name}:{frame.lineno}"
            break
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    kind = type(exc).__name__
    if "DataDependentOutput" in kind or "DynamicOutputShape" in kind:
        text = (f"{text}: this operation's result depends on tensor values, which a fake run "
                "does not have")
    return f"{site + ': ' if site else ''}{kind}{': ' + text if text else ''}"


def child(req: dict[str, Any]) -> int:
    """Run one request in this (forked) process; write its result; the exit status."""
    log = replace_new(req["log"])  # 0600, never through a link (memscope/safe_files.py)
    os.dup2(log, 1)
    os.dup2(log, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    sys.stdin = open(os.devnull)  # not the server's buffered requests
    try:
        os.chdir(req.get("cwd") or os.getcwd())  # before the script's path is made absolute
        out = FakeRun(req).run()
    except BaseException as exc:  # memscope's own failure: still one result
        out = {"schema": "memscope.fakerun/1", "status": "error",
               "error": f"memscope fake run failed: {type(exc).__name__}: {exc}", "steps": []}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    with output(req["result"], "fake run:", named=False) as f:  # a temporary file renamed into place
        json.dump(out, f, default=str)
    return 0


def _accelerator_build() -> bool:
    """A torch built with CUDA (or ROCm). There a backward in the server would start autograd's
    device threads (asking the driver for its devices): every forked trial then fails, with
    "CUDA error: initialization error" on a GPU machine and "Unable to handle autograd's
    threading in combination with fork-based multiprocessing" without one (both seen on an H100
    machine; a CPU-only torch has neither)."""
    return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None


def _warm_up() -> None:
    """Import and initialise, once, what every trial would otherwise load again (FakeTensorMode
    imports torch._dynamo; meta kernels and decompositions load lazily): a small fake training
    step with autocast and checkpointing (its backward only on a CPU-only torch, see
    _accelerator_build). Nothing it patches or registers outlives it."""
    import torch.utils.checkpoint
    import torch.utils.data  # noqa: F401

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
            opt = torch.optim.AdamW(model.parameters())
            x = torch.randn(4, 8)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False)
            loss = torch.nn.functional.cross_entropy(y.float(), torch.randint(0, 8, (4,)))
            if not _accelerator_build():
                loss.backward()
                opt.step()
    except Exception:
        pass


def serve() -> None:
    """Answer requests from stdin until it closes; each one in a forked child."""
    _warm_up()
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        pid = os.fork() if hasattr(os, "fork") else 0
        if pid == 0:
            code = 1
            try:
                code = child(req)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"id": req.get("id"), "status": os.waitstatus_to_exitcode(status)}) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
