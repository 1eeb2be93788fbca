"""The step's live-tensor peak once part of its forward is checkpointed: one model for
whole-block checkpointing (the ``activation_checkpointing`` suggestion), ``checkpoint_sequential``
segments, and selective checkpointing (memscope.analysis.sac_plan: ``report``'s suggestion,
``whatif``'s prediction). Pure (no torch).

A checkpointed region (a block, a segment) keeps from its forward to its backward its input
(the checkpoint holds it) and what the plan keeps, instead of what autograd saved in it; when
backward reaches it, its forward is rerun and its saved tensors are live again, with its
backward's own tensors (the gradients it makes) beside them. So the peak after the change is the
highest of:

* the end of the forward: the peak now, less what every checkpointed region drops;
* each checkpointed region's forward: what was live when it began, less what the regions before
  it dropped, plus what its own tensors take at once (measured runs only);
* each checkpointed region's rerun: what is live when its backward begins (the regions before it
  still holding only their inputs) plus the most its rerun adds at once;
* each region's backward: what its backward held at most, less what the regions before it drop;
* the peak now, where it lies outside all of these (an optimizer step): no plan moves it;
* the optimizer's step, where its own peak was measured apart (memscope.analysis.step_peaks):
  a peak in backward falls only down to it.

What was live around each region's backward (the :class:`Backward` "timeline") is measured by a
``memscope whatif`` baseline (the ``sac_live`` event), else modelled (:func:`modelled_backward`)
from what is alive beside the regions (model state, activations saved outside them), what each
region saved, holds and outputs, and its backward's transients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


RERUN = "its recompute: its saved tensors and the locals beside them, at once"


@dataclass(frozen=True)
class Region:
    """One stretch of the forward the plan may checkpoint, and what it costs."""

    name: str
    saved: int  # bytes autograd keeps for it without checkpointing (storages it made)
    kept: int  # of ``saved``, what it still keeps once checkpointed until its backward (SAC's
    # kept outputs)
    rerun: int  # the most bytes its rerun adds at once to what is live when its backward begins
    transient: int  # the most bytes its backward adds to what it saved: the gradients it makes
    held: int = 0  # its input where no region before it saved it: live in both (saved by its
    # first layer, or held by its checkpoint)
    output: int = 0  # its output: the gradient of it starts its backward
    inside: int | None = None  # the most its own tensors take at once in its checkpointed forward
    checkpointed: bool = True
    # of ``saved``, its output, which the next region's checkpoint holds as its input until that
    # region's backward is done (a block ending in a ReLU saved it itself)
    carried: int = 0
    # its input where the baseline let it go (its first layer saves its output, a ReLU) and the
    # checkpoint holds it to its backward (or, not checkpointed, checkpoint_sequential's local
    # holds it to the end of the forward)
    extra: int = 0
    params: int = 0  # its parameters' bytes: their gradients are made in its backward

    @property
    def drop(self) -> int:
        """What it stops keeping from its forward until the next region's backward is done, less
        the input its checkpoint holds beyond the baseline (not checkpointed: that input, held
        to the end of the forward, negative)."""
        if not self.checkpointed:
            return -self.extra
        return self.saved - self.kept - self.carried - self.extra

    @property
    def rerun_drop(self) -> int:
        """What it does not hold when its own backward begins: the output it carried is free by
        then (the next region's backward is done), and its rerun makes it again."""
        return self.saved - self.kept - self.extra if self.checkpointed else 0


@dataclass(frozen=True)
class Backward:
    """What a baseline held around the regions: the step's peak before the backward reached
    them, and per region (forward order) the live bytes when its backward began and the most
    during it; ``forward_starts``: per region, the live bytes when its forward began."""

    forward_peak: int | None
    blocks: tuple[tuple[int, int], ...]
    forward_starts: tuple[int, ...] = ()
    measured: bool = True  # False: modelled (:func:`modelled_backward`)


@dataclass(frozen=True)
class PeakAfter:
    """The modelled peak: its bytes, where it is, and the parts it adds up from (name, bytes)."""

    bytes: int
    at: str
    parts: tuple[tuple[str, int], ...]
    dropped: int  # what the checkpointed regions drop at the end of the forward, together


def modelled_backward(peak: int, beside: int, regions: Sequence[Region], unmade: int = 0, after: int = 0) \
        -> Backward:
    """The timeline of a run that did not measure its regions' backward: the forward ends at
    ``peak`` (the step's live-tensor peak: the working set of the loss is live there and freed
    before the regions' backward); region k's backward begins with what is live beside the
    regions (``beside``: model state, activations saved outside them, the model's output), what
    regions 0..k saved and hold, and the gradient of region k's output, and adds its transients.
    ``unmade``: gradient bytes counted in ``beside`` that were not live at the peak (freed by
    ``zero_grad()`` before it): those of region k and the regions before it are not made yet when
    k's backward begins; its own are made during it. Region k's forward begins with ``beside``
    but those gradients and ``after`` (what only exists after the forward: the model's output),
    what the regions before it saved and hold, and its own input."""
    live = beside + sum(r.saved + r.held for r in regions)
    windows: list[tuple[int, int]] = []
    for k in reversed(range(len(regions))):
        r = regions[k]
        missing = min(unmade, sum(x.params for x in regions[:k + 1]))
        start = live + r.output - missing
        windows.append((start, start + r.transient + min(r.params, missing)))
        live -= r.saved + r.held
    starts, live = [], beside - unmade - after
    for r in regions:
        starts.append(live + r.held + r.extra)
        live += r.saved + r.held
    return Backward(peak, tuple(reversed(windows)), tuple(starts), measured=False)


def peak_after(peak: int, live: Backward, regions: Sequence[Region], optimizer: int | None = None) -> PeakAfter:
    """The step's peak once the ``checkpointed`` regions are (the module docstring's terms),
    from the peak now and the timeline around the regions; ``optimizer``: the optimizer step's
    own peak, where measured apart."""
    drops = [r.drop for r in regions]
    n = len(regions)

    def dropped(k: int) -> int:  # regions 0..k-1 drop this together
        return sum(drops[:k])

    forward = live.forward_peak if live.forward_peak is not None else peak
    terms: list[tuple[int, str, tuple[tuple[str, int], ...]]] = [
        (forward - dropped(n), "the end of the forward",
         (("the peak now", forward), ("what the checkpointed regions drop", -dropped(n))))]
    for k, start in enumerate(live.forward_starts[:n]):
        r = regions[k]
        if r.checkpointed and r.inside is not None:
            terms.append((start - dropped(k) + r.inside, f"{r.name}'s forward",
                          (("live when it began", start), ("what the regions before it drop", -dropped(k)),
                           ("its own tensors at once, checkpointed", r.inside))))
    for k, (start, window) in enumerate(live.blocks[:n]):
        r = regions[k]
        beside = start - r.output - r.saved - r.held - dropped(k)  # and the regions before it
        if r.checkpointed:
            terms.append((start - dropped(k) - r.rerun_drop + r.rerun, f"{r.name}'s recompute",
                          _parts(beside, r, (RERUN, r.rerun))))
        # its checkpoint holds an input the baseline let go until its backward is done
        extra = r.extra if r.checkpointed else 0
        terms.append((window - dropped(k) + extra, f"{r.name}'s backward",
                      _parts(beside, r, ("its backward's transients: the gradients it makes", window - start))))
    if peak > max([forward] + [w for _, w in live.blocks]):
        terms.append((peak, "outside the checkpointed regions (the optimizer step)", (("the peak now", peak),)))
    if optimizer is not None:
        terms.append((optimizer, "the optimizer's step", (("its live-tensor peak, measured", optimizer),)))
    best = max(terms, key=lambda t: t[0])
    return PeakAfter(best[0], best[1], best[2], dropped(n))


def _parts(beside: int, r: Region, extra: tuple[str, int]) -> tuple[tuple[str, int], ...]:
    """A backward term's parts: what is live beside the region (model state, activations saved
    outside the regions, the inputs and kept tensors of the regions before it), the region's
    input, what it keeps (its rerun then brings the rest back) or its saved tensors, the
    gradient of its output, and ``extra``."""
    held = r.held + (r.extra if r.checkpointed else 0)
    mine = ("its input and what it keeps", held + r.kept) if extra[0] == RERUN else \
        ("its input and its saved tensors, recomputed", held + r.saved)
    return (("beside it: model state, activations saved outside the regions, what the regions before it keep",
             beside), mine, ("the gradient of its output", r.output), extra)
