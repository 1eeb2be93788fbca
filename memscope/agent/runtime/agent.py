"""The agent: everything memscope runs inside the training process, wired together.

Rules it keeps (DESIGN.md section 5): it never raises into the training, a failing collector
disables itself and leaves an event in the run file, it keeps no reference to a tensor, and the
training thread only ever enqueues rows.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import sqlite3
import sys
import threading
import time
import traceback
from typing import Any

import torch

from memscope.agent.collectors import cuda
from memscope.agent.torchcompat import frameworks
from memscope.agent.torchcompat.compiled import compiled_seen
from memscope.agent.torchcompat.module_parents import module_parents
from memscope.agent.runtime.config import (
    ENV_DB_ID,
    ENV_SUPERVISOR,
    AgentOptions,
    block_profile_wanted,
    techniques_wanted,
)
from memscope.agent.collectors.evaluations import EvaluationWatch
from memscope.agent.collectors.layers import LayerProfiler
from memscope.agent.collectors.measure_budget import Measure, bounded_message
from memscope.agent.collectors.peak_step import PeakStep
from memscope.agent.collectors.leak_collector import LeakCollector
from memscope.agent.collectors.oom import OomRecorder, is_oom
from memscope.agent.collectors.oom_hooks import alloc_conf
from memscope.agent.collectors.sampler import RssReader, Sampler, StepPeak, rss_high_water_mark
from memscope.agent.collectors.steps import StepTracker
from memscope.agent.runtime import interrupts
from memscope.agent.runtime.exec_hook import ExecHook
from memscope.agent.runtime.watchdog import SupervisorWatch
from memscope.redact import Redaction
from memscope.store.runs import finish_run, register_writer
from memscope.store.schema import RunFileError
from memscope.store.writer import RunWriter, update_statement
from memscope.turns import TurnThread

_DEVICE_RESCAN_S = 1.0


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _file_id(owns_run: bool) -> tuple[int, int] | None:
    """The run file's (st_dev, st_ino) as attach's supervisor created it, so a file put in its
    place before this process opened it is noticed too; None: the writer takes it at open."""
    raw = os.environ.get(ENV_DB_ID, "") if not owns_run else ""
    try:
        dev, ino = raw.split(":")
        return int(dev), int(ino)
    except ValueError:
        return None


class Agent:
    def __init__(self, db: str, options: AgentOptions, owns_run: bool, attach: Any = None,
                 at_torch_import: bool = False) -> None:
        self.db = db
        # started by attach's bootstrap as torch's import ended: no module of the script exists yet
        self.at_torch_import = at_torch_import
        self.options = options
        self.owns_run = owns_run  # memscope.start() created the run file; attach's supervisor did not
        # injected into a running process (memscope attach --pid): an attached.Attachment
        self.attach = attach
        self.proc_id: int | None = None
        self.running = False
        self.samples = 0
        self._sampled_at = 0.0  # when the last sample was taken
        self._half_sample_s = 0.5 / options.sample_hz  # see _boundary_sample_due
        self.device = "cpu"
        self._lock = threading.Lock()
        # The sampler thread and the training thread (at step boundaries) both take samples;
        # one at a time keeps the sample count and the CUDA device list consistent.
        self._tick_lock = threading.Lock()
        self._rss = RssReader()
        self._writer = RunWriter(db, options.queue_size, options.flush_interval,
                                 file_id=attach.db_id if attach is not None else _file_id(owns_run))
        self._tracker = StepTracker(self._on_step_close)
        self._tracker.on_close_error = self._step_close_failed
        self._step_failures: set[str] = set()  # parts of a step boundary that failed (said once)
        self._sampler = Sampler(options.sample_hz, self._tick, self._sampler_failed)
        # the one thread memscope starts here: the writer's turns, the samples, the watch
        self._turns = TurnThread("memscope")
        self._rss_peak = StepPeak(rss_high_water_mark())
        self._cuda_enabled = True
        self._cuda_devices: list[int] = []
        self._cuda_peaks: dict[int, tuple[StepPeak, StepPeak]] = {}
        self._cuda_scanned = 0.0
        self._cuda_limits: dict[int, int | None] = {}  # device -> bytes it may use (OOM arming)
        self._nvml: cuda.Nvml | None = None
        self._nvml_enabled = options.nvml
        self._nvml_last = 0.0
        self._layers_enabled = options.layers_every > 0
        self._layers = LayerProfiler(in_optimizer=lambda: self._tracker.phase == "optimizer")
        # a measured step's cost, priced as it goes (memscope.agent.collectors.measure_budget)
        self._layers_measure = Measure()
        self._cpu0: tuple[int, float] | None = None  # (training thread, its CPU time) at the start
        self._leaks = LeakCollector(self, options.inventory_every, options.inventory_budget)
        self._evaluations_enabled = True
        self._evaluations = EvaluationWatch(self.models, self._evaluation_event)
        self._last_breakdown: dict[str, Any] | None = None
        self._oom = OomRecorder(self)
        # one step's exact live-tensor peak on CPU (the allocator's on CUDA): for the suggestions
        self._peak = PeakStep(self, lambda: self._cuda_enabled and bool(cuda.cuda_devices_in_use()),
                              self._leaks.live_tensors)
        self._watch: SupervisorWatch | None = None
        self._whatif: Any = None  # memscope.agent.whatif.techniques.Controller, when wanted
        self._exec = ExecHook(self._before_exec)  # os.execv* flushes and ends the record first
        self._pid = os.getpid()
        self._block_profile: Any = None  # memscope.agent.whatif.sac_once.OnceProfile

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.proc_id, spill_file = register_writer(self.db, {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "rank": _env_int("RANK"),
            "local_rank": _env_int("LOCAL_RANK"),
            "world_size": _env_int("WORLD_SIZE"),
            "argv": list(sys.argv),
            "device": "cpu",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "options": self.options.to_json(),
            "started": time.time(),
            "heartbeat": time.time(),
            "status": "running",
            **(self.attach.process_fields() if self.attach is not None else {}),
        }, redaction=Redaction.from_options(self.options))
        # the writer stamps this row about every second: heartbeat, drop count, samples so far
        self._writer.proc_id = self.proc_id
        self._writer.use_spill(spill_file)  # made and recorded with the process row
        self._writer.samples = lambda: self.samples
        self._writer.start(self._turns)
        if self.attach is None:
            self._tracker.install()  # attached: last, once every part is ready (the training runs)
        self._tracker.on_error = self._backward_error
        # torch.compile(module) results, seen being built: asking costs nothing per step
        self._guard_call("compile", compiled_seen.start)
        # who holds which module, for the layer names (no heap walk when it can answer)
        self._guard_call("module parents", lambda: module_parents.start(complete=self.at_torch_import))
        self._guard_call("oom", self._oom.install)
        self._whatif = None  # max_steps, try_techniques, simulate_gpu, tensor_peak (memscope whatif)
        if techniques_wanted(self.options):
            from memscope.agent.whatif.techniques import Controller
            self._whatif = Controller(self)
            self._guard_call("techniques", self._whatif.install)
        self._guard_call("interrupts", lambda: interrupts.install(self._on_thread_soon))  # ^C goes on
        self._guard_call("exec", self._exec.install)
        self._guard_call("inventory", lambda: self._leaks.start(fresh=self.at_torch_import))  # the live-tensor registry
        if block_profile_wanted(self.options):
            from memscope.agent.whatif.sac_once import OnceProfile
            self._block_profile = OnceProfile(self.event)
        self.running = True
        self._tick()  # a first sample at t0, before any training
        supervisor = _env_int(ENV_SUPERVISOR) if self.attach is None else None
        if self.attach is not None:
            self.attach.install_tracker(self._tracker)  # on the training thread when it must be
            self.attach.started(self._turns)  # its supervisor watch and detach requests
        if supervisor is not None and not self.owns_run:
            self._watch = SupervisorWatch(supervisor, self._supervisor_gone)
            self._watch.start()
            self._turns.every(self._watch.interval, self._watch.check)  # no thread of its own
        self._turns.add(self._sampler, self._sampler.interval)
        try:
            self._turns.start()
        except Exception as exc:  # RuntimeError: can't start new thread (a thread or memory limit)
            self._thread_failed(exc)
            raise
        if self.attach is None:
            self._cpu0 = (threading.get_ident(), time.thread_time())  # on the training thread
            self._layers_next(0)  # attached: at the first boundary (Attachment.anchored)

    def _thread_failed(self, exc: BaseException) -> None:
        """memscope's thread did not start: nothing would write the rows. Said in the run file
        (written here, on the training's thread: the writer writes synchronously without its
        thread), then every hook is removed and the process row ended, so the training goes
        on as it would without memscope."""
        why = f"{type(exc).__name__}: {exc}"
        self.event("agent_failed", f"recording stopped in pid {os.getpid()}: memscope's thread could "
                                   f"not start ({why}); the training went on unrecorded",
                   {"pid": os.getpid(), "error": why})
        self.stop()

    def _on_thread_soon(self, call: Any) -> bool:
        """Run ``call`` once on memscope's thread, now; False when that thread is not running."""
        if not self._turns.is_alive():
            return False
        self._turns.add(lambda: call() and None)
        return True

    def _supervisor_gone(self, pid: int) -> None:
        """``memscope attach`` died without ending the run (SIGKILL): say so, flush, and end
        this process too, as its direct child the kernel already would (PR_SET_PDEATHSIG)."""
        try:
            self.event("supervisor_gone", f"memscope attach (pid {pid}) died during the run; "
                                          "the training was ended with it")
            self._writer.close(timeout=2.0)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)

    def stop(self, detaching: bool = False, on_training_thread: bool = True) -> None:
        """Remove hooks, flush, and record how this process ended. Idempotent. ``detaching``
        (memscope detach): the process goes on; the optimizer hooks are removed later, on the
        training thread (:meth:`remove_late_hooks`), and the row says ``detached``. Off the
        training thread (``on_training_thread=False``), a measured step's thread-local state
        (saved-tensor hooks, a dispatch mode) is ended there later too."""
        if not self.running:
            return
        if self._watch is not None:
            self._watch.stop()
        if detaching:  # the rest at the training thread's next backward: remove_late_hooks
            self._tracker.disable(then=self.remove_late_hooks)
        else:
            self._tracker.remove()
        if on_training_thread:
            self._layers_stop()
            self._peak.stop()
        else:
            self._layers.active = False  # its hooks do nothing from now on
            self._late_stops = [self._layers_stop, self._peak.stop]
        if self._whatif is not None:
            self._whatif.stop()
        if self._block_profile is not None:
            self._guard_call("block profile", self._block_profile.stop)
        self._leaks.stop()
        self._sampler.stop()
        try:
            self._tick()  # the last sample
        except Exception:
            pass
        if self._evaluations_enabled:
            self._guard_call("evaluations", self._evaluations.finish, time.time(), self._tracker.step)
        self._guard_call("oom", self._oom_finish)
        self._guard_call("compile", compiled_seen.stop)
        self._guard_call("module parents", module_parents.stop)
        self._guard_call("exec", self._exec.remove)
        self.running = False
        self._writer.close()
        if self._nvml is not None:
            self._nvml.close()
        self._finish_process_row("detached" if detaching else "stopped")
        self._writer.close_spill()
        if self.owns_run and self._writer.file_gone() is None:
            try:
                finish_run(self.db, exit_code=None, signal=None, status="finished")
            except RunFileError:
                pass  # nothing to write it to; readers call the run abandoned once we are gone
        self._rss.close()

    def step_state_held(self) -> bool:
        """Whether a step under measurement holds thread-local state on the training thread now
        (the layer profiler's saved-tensor hooks, the one-step peak's mode, a leak site capture)."""
        return bool(self._layers.active or self._peak.peak is not None or self._leaks.sites.capturing)

    def remove_late_hooks(self) -> None:
        """After a detach, at the training thread's next backward (the tracker has removed its
        hooks): what a detach from memscope's thread had to leave to this thread."""
        for stop in getattr(self, "_late_stops", []):
            try:
                stop()
            except Exception:  # noqa: BLE001 - inert already
                pass
        self._late_stops = []

    def _before_exec(self, name: str, args: tuple[Any, ...]) -> None:
        """``os.<name>(*args)`` is about to replace this process's program (an exec: said in an
        event) or end it without exit handlers (``_exit``): end the record first (flushed, the
        process row ended); a new program that imports torch under attach is recorded as a
        process of its own. Not in a forked child (nothing of ours runs there)."""
        if not self.running or os.getpid() != self._pid:
            return
        if name == "_exit":  # the process ends without its exit handlers: the agent's stop first
            self._stop_for_good()
            return
        argv = [str(a) for a in args[1]] if len(args) > 1 and isinstance(args[1], (list, tuple)) else []
        argv = Redaction.from_options(self.options).argv(argv)
        step = self._tracker.step
        self.event("exec", f"pid {os.getpid()} replaced its program with os.{name} ({' '.join(argv[:8])}) "
                           f"during step {step}: its record ends there, flushed",
                   {"pid": os.getpid(), "call": name, "argv": argv, "step": step})
        self._stop_for_good()

    def _stop_for_good(self) -> None:
        from memscope.agent.runtime import api  # the one agent of the process: its stop, as at exit

        if api.current() is self:
            api.stop()
        else:
            self.stop()

    def disable_after_fork(self) -> None:
        """In a forked child (a DataLoader worker): inherited hooks become no-ops; no threads
        exist here and none are started."""
        self.running = False
        self._tracker.enabled = False
        self._layers.active = False
        self._peak.after_fork()
        self._leaks.after_fork()
        module_parents.stop()

    # -- per-layer profiling -------------------------------------------------------------------

    def _layers_next(self, step: int) -> None:
        """At the boundary before ``step``: install the layer hooks if it is a profiled step."""
        if not (self._layers_enabled and self.running and self.options.profiles_layers(step)):
            return
        try:
            self._layers_measure.start(time.thread_time(), self._trained_cpu())
            self._layers.begin(step)
            self._tracker.on_backward_end = self._measured_backward
            if self._layers.saved_hooks_error:
                self.event("warning", f"layers: saved tensors not measured in step {step}: "
                                      f"{self._layers.saved_hooks_error}")
        except Exception as exc:
            self._layers_failed(exc)

    def _layers_close(self, step: int) -> None:
        """At the boundary that ends a profiled step: remove the hooks and write its rows."""
        if not self._layers.active:
            return
        try:
            cut = self._layers.cut_short
            if cut:  # the closure evaluations after the cut ran unprofiled: counted still
                self._layers.count_unprofiled(*self._layers_measure.unmeasured(*self._tracker.closed_backwards))
            rows = self._layers.end()
            if self._layers.step != step:
                return  # hooks installed for a step that never ran as such
            if cut and self._layers_measure.cut_at is not None:
                measured = self._layers_measure.cut_at[1]
                total = measured + self._layers_measure.unmeasured(*self._tracker.closed_backwards)[1]
                self.event("measure_bounded", bounded_message(step, "layers were profiled", measured, total,
                                                              self._layers_measure.cost_at_cut),
                           {"step": step, "what": "layers", "measured": measured, "total": total})
            for r in rows:
                self._writer.insert("layer_stats", {
                    "proc": self.proc_id, "step": step, "module": r.name, "type": r.type,
                    "calls": r.calls, "saved_bytes": r.saved_bytes,
                    "saved_tensors": r.saved_tensors, "output_bytes": r.output_bytes,
                    "forward_s": r.forward_s, "backward_s": r.backward_s,
                    "alloc_delta": r.alloc_delta, "alloc_peak": r.alloc_peak,
                    "micro_batches": self._layers.micro_batches})
            kernels = {r.name: r.kernels for r in rows if r.kernels}
            if kernels:  # which scaled_dot_product_attention kernel each module ran
                used = sorted({k for ks in kernels.values() for k in ks})
                self.event("attention_kernels", f"step {step}: scaled_dot_product_attention ran its "
                           f"{', '.join(used)} kernel in {len(kernels)} module(s)",
                           {"step": step, "modules": kernels})
            opts = [type(o).__name__ for o in list(self._tracker.optimizers)]
            if len(opts) > 1:  # several optimizers (a GAN's): forwards per step are not micro-batches
                self.event("optimizers", f"step {step}: {len(opts)} optimizers stepped ({', '.join(sorted(opts))})",
                           {"step": step, "optimizers": sorted(opts)})
            closure, micro = self._layers.closure_forwards, self._layers.micro_batches
            if closure >= 2:  # one is a wrapper's (Lightning runs training_step in a closure)
                self.event("closure", f"step {step}: {closure} of its {micro} forwards ran inside "
                           "optimizer.step() (a closure the optimizer evaluates, as LBFGS does)",
                           {"step": step, "forwards": closure, "micro_batches": micro})
            if self._layers.saved_hooks_error is None:
                bd = self._layers.breakdown(list(self._tracker.optimizers))
                self._writer.insert("step_breakdown", {"proc": self.proc_id, "step": step, **bd})
                self._last_breakdown = {"step": step, **bd}
        except Exception as exc:
            self._layers_failed(exc)

    def _measured_backward(self, closure: bool) -> None:
        """The end of a backward in a measured step (on the training thread): a measurement
        that has cost its share stops for the rest of the step (measure_budget)."""
        tracker = self._tracker
        now = time.thread_time()
        if self._layers.active and not self._layers.cut_short and self._layers_measure.due_cut(closure, now):
            self._layers_measure.cut(now, tracker.backwards, tracker.closure_backwards)
            self._layers.cut()
        if self._peak.peak is not None:
            self._peak.backward_end(closure, now, tracker.backwards, tracker.closure_backwards)

    def _trained_cpu(self) -> float:
        """The training thread's CPU seconds since recording began (0: another thread began it,
        or it is not known yet: a measurement then gets its allowance alone)."""
        start = self._cpu0
        if start is None or start[0] != threading.get_ident():
            return 0.0
        return time.thread_time() - start[1]

    def _layers_stop(self) -> None:
        try:
            if self._layers.active:
                self._layers.end()  # a step cut short: its rows are not written
        except Exception:
            pass

    def _layers_failed(self, exc: BaseException) -> None:
        self._layers_enabled = False
        try:
            self._layers.end()
        except Exception:
            pass
        self.event("collector_disabled", f"layers: {type(exc).__name__}: {exc}")

    def step(self) -> None:
        if self.running:
            self._tracker.manual_step()

    def steps_anchored(self) -> None:
        """Attached to a running process: the first step boundary was seen, step 0 begins."""
        if self._cpu0 is None:
            self._cpu0 = (threading.get_ident(), time.thread_time())
        self._layers_next(0)

    def __repr__(self) -> str:
        """What a notebook cell shows for ``memscope.start(...)`` (and ``profile(...) as rec``)."""
        state = f"recording, step {self.current_step}" if self.running else "stopped"
        return f"<memscope {state} into {self.db!r}; memscope.load({self.db!r}) reads it>"

    # -- the collectors' interface (memscope.agent.collectors.host.CollectorHost) -------------------------

    @property
    def current_step(self) -> int:
        return self._tracker.step

    @property
    def step_start(self) -> float:
        return self._tracker.step_start

    @property
    def phase(self) -> str:
        return self._tracker.phase

    def insert(self, table: str, row: dict[str, Any]) -> bool:
        return self._writer.insert(table, row)

    def optimizers(self) -> list[Any]:
        return list(self._tracker.optimizers)

    def graph_saved_ids(self) -> set[int]:
        return self._layers.saved_alias_ids()

    def rss(self) -> int:
        return self._rss()

    def module_prefix(self, module: Any) -> str:
        return self._layers.root_prefix(module)

    def module_name(self, module: Any) -> str | None:
        return self._layers.module_name(module)

    def models(self) -> list[Any]:
        return self._layers.roots()

    # -- sampling ------------------------------------------------------------------------------

    def _tick(self, wait: bool = True) -> None:
        """One sample of every enabled collector (sampler thread, and at step boundaries).

        ``wait=False`` (the training thread at a step boundary): when the sampler is taking a
        sample right now, that one stands for the boundary, and the step never waits on it
        (an NVML reading can take milliseconds)."""
        if not self.running:
            return
        if not wait and not self._boundary_sample_due():
            # steps far shorter than the sampling interval: the step row's own reading at this
            # boundary (end_rss, the step's peak) stands for it; a sample per boundary of 2,000
            # steps a second cost a /proc read and a row each
            return
        if not self._tick_lock.acquire(blocking=wait):
            return
        try:
            self._sample_once()
        finally:
            self._tick_lock.release()

    def _boundary_sample_due(self) -> bool:
        """Whether a step boundary takes a sample: not when the last one (the sampler's or a
        boundary's) is younger than half the sampling interval (see :meth:`_tick`)."""
        return time.time() - self._sampled_at >= self._half_sample_s

    def _sample_once(self) -> None:
        t = self._sampled_at = time.time()
        rss = self._rss()
        with self._lock:
            self._rss_peak.observe(rss)
            step = self._tracker.step
        if self._writer.insert("samples", {"proc": self.proc_id, "t": t, "step": step,
                                           "phase": self._tracker.phase, "rss": rss}):
            self.samples += 1
        if self._evaluations_enabled:
            self._guard("evaluations", lambda now: self._evaluations.observe(now, step), t)
        if self._cuda_enabled:
            self._guard("cuda", self._tick_cuda, t)
        if self._nvml_enabled and self._cuda_devices and t - self._nvml_last >= self.options.nvml_interval:
            self._nvml_last = t
            self._guard("nvml", self._tick_nvml, t)

    def _tick_cuda(self, t: float) -> None:
        if t - self._cuda_scanned >= _DEVICE_RESCAN_S:
            self._cuda_scanned = t
            devices = cuda.cuda_devices_in_use()
            if devices:
                self._guard_call("oom", self._oom.attach_cuda_observer)  # CUDA is initialised now
            if devices and not self._cuda_devices:
                self.device = "cuda" if len(devices) > 1 else f"cuda:{devices[0]}"
                self._writer.update("processes", {"id": self.proc_id}, {"device": self.device})
                self._guard_call("cuda", self._cuda_first_seen)
            for index in devices:
                if index not in self._cuda_limits:
                    self._cuda_limits[index] = cuda.device_limit(index, self.options.simulate_gpu)
            self._cuda_devices = devices
        for index in self._cuda_devices:
            stats = cuda.read_device_stats(index)
            with self._lock:
                if index not in self._cuda_peaks:
                    self._cuda_peaks[index] = (StepPeak(stats["allocated_peak"]),
                                               StepPeak(stats["reserved_peak"]))
                alloc_peak, reserved_peak = self._cuda_peaks[index]
                alloc_peak.observe(stats["allocated"])
                reserved_peak.observe(stats["reserved"])
            self._writer.insert("cuda_samples", {"proc": self.proc_id, "t": t, "device": index, **stats})

    def _cuda_first_seen(self) -> None:
        """Once CUDA is in use: the allocator configuration, for the fragmentation advice."""
        conf = alloc_conf()
        self.event("cuda_allocator", f"allocator configuration: {conf or '(default)'}",
                   {"alloc_conf": conf, "expandable_segments": cuda.expandable_segments(conf)})

    def _tick_nvml(self, t: float) -> None:
        if self._nvml is None:
            self._nvml = cuda.Nvml()
        for index in self._cuda_devices:
            used, total = self._nvml.memory(index)
            self._writer.insert("nvml_samples", {"proc": self.proc_id, "t": t, "device": index,
                                                 "used": used, "total": total})

    def _guard(self, name: str, fn: Any, t: float) -> None:
        try:
            fn(t)
        except Exception as exc:
            setattr(self, f"_{name}_enabled", False)
            self.event("collector_disabled", f"{name}: {type(exc).__name__}: {exc}")

    def _sampler_failed(self, exc: BaseException) -> None:
        self.event("collector_disabled",
                   f"sampler: {type(exc).__name__}: {exc}",
                   {"traceback": traceback.format_exception(exc)[-3:]})

    # -- steps ---------------------------------------------------------------------------------

    def _step_part(self, name: str, fn: Any, *args: Any) -> Any:
        """One part of a step boundary, ``fn(*args)``; a failure (no file descriptor left to read
        /proc, say) is said once in an event and the step row is written without that part."""
        try:
            return fn(*args)
        except Exception as exc:
            self._part_failed(name, exc)
            return None

    def _part_failed(self, name: str, exc: BaseException) -> None:
        if name not in self._step_failures:
            self._step_failures.add(name)
            self.event("warning", f"step boundary: {name} failed from step "
                                  f"{self._tracker.step}: {type(exc).__name__}: {exc}",
                       {"part": name, "error": f"{type(exc).__name__}: {exc}"})

    def _step_close_failed(self, step: int, exc: BaseException) -> None:
        """A boundary that failed before its row was queued: the step is lost, and said so."""
        self._writer.count_lost_step(f"a step boundary failed: {type(exc).__name__}: {exc}")

    def _on_step_close(self, step: int, start: float, end: float) -> None:
        # Every part is called only when it has work, each asked through an attribute: on steps
        # of ~1 ms the boundary runs 2,000 times a run, with the caches cold after the step's
        # own work (the same code costs about three times what it does in a loop)
        tracker = self._tracker
        if tracker.on_backward_end is not None:
            tracker.on_backward_end = None  # set again below when the next step is measured
        peak = self._peak
        if peak.peak is not None:
            peak.step_closed(step, tracker.closed_backwards)  # first: the boundary's tensor work is not the step's
        profiled = self._layers.active
        if profiled:
            self._step_part("layers", self._layers_close, step)
        if step == 0:  # by the first boundary the trainer driving the loop is imported
            self._guard_call("framework", self._note_framework)
        if self._evaluations.in_progress:
            self._guard_call("evaluations", self._evaluations.boundary, end, step)
        if self._boundary_sample_due():
            self._step_part("sample", self._tick, False)
        hwm = rss_high_water_mark()
        rss_now: int | None
        vms_now: int | None
        try:
            rss_now, vms_now = self._rss.rss_vms()
        except Exception as exc:
            self._part_failed("memory reading", exc)
            rss_now = vms_now = None
        cuda_share = 0.0
        peak_alloc = peak_reserved = end_alloc = None
        with self._lock:
            peak_rss = self._rss_peak.close(hwm, rss_now)
            if self._cuda_peaks:
                peak_alloc, peak_reserved, end_alloc, cuda_share = self._close_cuda_peaks()
        self._writer.insert("steps", {"proc": self.proc_id, "step": step, "start": start, "end": end,
                                      "peak_rss": peak_rss, "peak_allocated": peak_alloc,
                                      "peak_reserved": peak_reserved, "status": "ok",
                                      "end_rss": rss_now, "end_allocated": end_alloc})
        profile_next = self._layers_enabled and self.options.profiles_layers(step + 1)
        # the layers' models change only on a profiled step: handed over after one
        self._guard_call("oom", self._oom_step_close, cuda_share, peak_rss, vms_now, profile_next,
                         profiled)
        # inventories (the memory level here can pull one forward), leak suspects' sites
        level = end_alloc if end_alloc is not None else rss_now
        self._step_part("inventory", self._leaks.step_closed, step, end - start, level or 0)
        if self._block_profile is not None and not self._block_profile.done:
            self._step_part("block profile", self._block_profile_next, step)
        if self._whatif is not None:
            self._whatif.step_closed(step)  # --max-steps raises SystemExit(0) here: see its doc
        if profile_next:
            self._layers_next(step + 1)
        if peak.step == step + 1:
            peak.step_opening(step + 1, self._trained_cpu())  # last: nothing of the boundary's runs under its mode
            if peak.peak is not None:
                tracker.on_backward_end = self._measured_backward
        if self.attach is not None:
            self.attach.step_closed(step)  # a detach asked for happens here, on the training thread

    def _close_cuda_peaks(self) -> tuple[int | None, int | None, int | None, float]:
        """Under the lock, at a step boundary: each CUDA device's step peaks closed (allocated,
        reserved), the bytes allocated now, and the largest reserved share of a device limit."""
        cuda_share = 0.0
        peak_alloc = peak_reserved = end_alloc = None
        for index, (alloc, reserved) in self._cuda_peaks.items():
            try:
                stats = cuda.read_device_stats(index)
            except Exception:
                continue
            peak_alloc = (peak_alloc or 0) + alloc.close(stats["allocated_peak"], stats["allocated"])
            device_reserved = reserved.close(stats["reserved_peak"], stats["reserved"])
            peak_reserved = (peak_reserved or 0) + device_reserved
            end_alloc = (end_alloc or 0) + int(stats["allocated"] or 0)
            limit = self._cuda_limits.get(index)
            if limit:
                cuda_share = max(cuda_share, device_reserved / limit)
        return peak_alloc, peak_reserved, end_alloc, cuda_share

    def _block_profile_next(self, step: int) -> None:
        """The selective-checkpointing profile (memscope.agent.whatif.sac_once): at the boundary
        after ``step``, on a step the layer profiler leaves alone (its saved-tensor hooks would
        not see the profiled block's), once the models are known (the layer profiler finds them)."""
        prof = self._block_profile
        if prof is None or prof.done:
            return
        later = self._layers_enabled and self.options.layers_every > 0 and self.options.layers_first > step
        prof.step_closed(step, self._layers.roots(), self._layers_enabled and self.options.profiles_layers(step + 1),
                         later)

    # -- out-of-memory post-mortems ------------------------------------------------------------

    def _backward_error(self, exc: BaseException) -> None:
        if self.running and is_oom(exc):
            self._oom.record(exc, exc.__traceback__, where="backward", phase="backward")

    def latest_breakdown(self) -> dict[str, Any] | None:
        """The breakdown of the last profiled step (parameters, gradients, ...), if any."""
        return dict(self._last_breakdown) if self._last_breakdown else None

    def _oom_step_close(self, cuda_share: float, peak_rss: int | None, vms: int | None,
                        profiled_next: bool, new_roots: bool) -> None:
        """The closed step's peak as a share of what the process may use: ``cuda_share`` of a
        device's, or the host's (``peak_rss``, address space ``vms``). ``profiled_next``: the
        layer profiler profiles the next step; ``new_roots``: it may know models the OOM hooks
        have not seen (after a profiled step)."""
        memory_share = max(cuda_share, self._oom.host_share(peak_rss, vms))
        self._oom.pending_failed = None  # the step that hit an OOM (caught) went on and closed
        self._oom.record_observed_leftovers(self)
        self._oom.step_closed(memory_share, profiled_next, self._layers.roots() if new_roots else None,
                              self.options.catch_forward_oom)

    def nvml_memory(self, index: int) -> dict[str, int | None] | None:
        """NVML's reading of a CUDA device now (used, total, this process's share), or None."""
        if not self._nvml_enabled:
            return None
        try:
            if self._nvml is None:
                self._nvml = cuda.Nvml()
            used, total = self._nvml.memory(index)
            return {"used": used, "total": total,
                    "process_used": self._nvml.process_used(index, os.getpid())}
        except Exception:
            return None

    def _oom_finish(self) -> None:
        """At stop: remove the hooks; a step in progress that hit an OOM is a failed step."""
        self._oom.remove()
        self._oom.record_observed_leftovers(self)
        pending = self._oom.pending_failed
        if pending is not None and pending["step"] == self._tracker.step:
            self._oom.pending_failed = None
            hwm = rss_high_water_mark()
            rss_now = self._rss()
            with self._lock:
                peak_rss = self._rss_peak.close(hwm, rss_now)
                # the failing step's CUDA peak too: it is the run's peak when memory ran out there
                peak_alloc, peak_reserved, _now, _share = self._close_cuda_peaks()
            self._writer.insert("steps", {"proc": self.proc_id, "step": pending["step"],
                                          "start": pending["start"], "end": time.time(),
                                          "peak_rss": peak_rss, "peak_allocated": peak_alloc,
                                          "peak_reserved": peak_reserved, "status": "failed"})

    def _guard_call(self, name: str, fn: Any, *args: Any) -> None:
        """Run a collector call, ``fn(*args)``; on failure, say so once and carry on."""
        try:
            fn(*args)
        except Exception as exc:
            self.event("collector_disabled", f"{name}: {type(exc).__name__}: {exc}")

    # -- events and the final row --------------------------------------------------------------

    def _note_framework(self) -> None:
        found = frameworks.detect()
        if found is not None:
            version = f" {found['version']}" if found["version"] else ""
            self.event("framework", f"{found['label']}{version} drives the training loop", found)

    def recording_problem(self) -> str | None:
        """Why this process's record is incomplete (the file never opened, structure rows lost),
        or None; shed samples are not a problem (the report counts them)."""
        w = self._writer
        steps = f"{w.lost_steps} steps, " if w.lost_steps else ""
        if w.error is not None:
            return f"{w.error}; {steps}{w.dropped} rows were not recorded"
        if w.dropped_structure:
            return (f"{steps}{w.dropped_structure} rows were lost "
                    f"({w.last_error or 'the writer fell behind'})")
        return None

    def event(self, kind: str, message: str, data: Any = None) -> None:
        self._writer.insert("events", {"proc": self.proc_id, "t": time.time(),
                                       "step": self._tracker.step, "kind": kind,
                                       "message": message,
                                       "data": json.dumps(data) if data is not None else None})

    def _evaluation_event(self, start: float, end: float, first: int | None, last: int | None,
                          model: str) -> None:
        """An evaluation, at its start on the timeline (its end in the data, as marks read it)."""
        self._writer.insert("events", {
            "proc": self.proc_id, "t": start, "step": first, "kind": "evaluation",
            "message": f"evaluation: {model} in eval mode for {end - start:.2f} s (from step {first})",
            "data": json.dumps({"end": end, "last_step": last, "model": model})})

    def _finish_process_row(self, status: str = "stopped") -> None:
        """The process row's last word. Never into a file that is no longer the run's; while
        the file refuses writes (a lock), left in the spill file for the supervisor."""
        writer = self._writer
        if writer.file_gone() is not None:
            return
        now = time.time()
        key = {"id": self.proc_id}
        values = {"ended": now, "status": status, "samples": self.samples, "dropped": writer.dropped,
                  "step_mode": self._tracker.mode, "device": self.device, "heartbeat": now}
        if writer.handed_off:
            writer.spill_update("processes", key, values)  # after the rows waiting there, in order
            return
        conn = None
        try:
            conn = sqlite3.connect(self.db, timeout=writer.busy_timeout)
            with conn:
                conn.execute(*update_statement("processes", key, values))
        except sqlite3.Error:
            # the supervisor writes it once the file takes writes (or marks the process lost)
            writer.spill_update("processes", key, values)
        finally:
            if conn is not None:
                conn.close()
