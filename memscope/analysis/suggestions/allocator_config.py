"""allocator_config: expandable segments against a fragmented CUDA cache."""

from __future__ import annotations

from memscope.analysis.oom import fragmentation
from memscope.analysis.suggestions.facts import Facts, Suggestion, _b

FRAGMENTED_SHARE = 0.10  # inactive split bytes at least this share of reserved: fragmented


def allocator_config(f: Facts) -> list[Suggestion]:
    """Inactive split blocks are reserved memory no allocation can reuse: fragmentation. Read at
    the OOM when the run had one (the cache held enough free bytes for the request but no block
    that large, or split blocks were a large share of reserved), else at the sample near the highest
    reserved memory where the most sat in split blocks. Not suggested when expandable segments are
    already on: they are the fix."""
    if f.expandable_segments:
        return []
    d = f.oom_allocator
    if d is not None:
        frag = fragmentation(d)
        if frag is None:
            return []
        reserved, split = frag["reserved_bytes"], frag["split_bytes"]
        blocked = ""
        if frag["blocked"]:
            blocked = (f"; the cache held {_b(frag['cached_free_bytes'])} free but its largest block was "
                       f"{_b(frag['largest_free_block_bytes'])}, less than the {_b(frag['requested_bytes'])} "
                       "asked for: fragmentation caused the out-of-memory error")
        retries = int(d.get("alloc_retries") or 0)
        evidence = (f"at the out-of-memory error ({_b(reserved)} reserved, {_b(int(d.get('allocated_bytes') or 0))} "
                    f"allocated) {_b(split)} ({split / reserved:.0%} of reserved) sat in inactive split "
                    "blocks" + blocked + (f"; {retries} allocation retries (cache flushes)" if retries else ""))
        return [Suggestion("allocator_config", split, evidence, _ALLOCATOR_HOW)]
    r = f.cuda_peak
    if r is None or not r.get("reserved") or r.get("inactive_split") is None:
        return []
    reserved, split = int(r["reserved"]), int(r["inactive_split"])
    allocated = int(r.get("allocated") or 0)
    retries = int(r.get("alloc_retries") or 0)
    if split < FRAGMENTED_SHARE * reserved:
        return []
    return [Suggestion(
        "allocator_config", split,
        f"near the highest reserved memory ({_b(reserved)} reserved, {_b(allocated)} allocated) "
        f"{_b(split)} ({split / reserved:.0%} of reserved) sat in inactive split blocks "
        "(fragmentation)" + (f"; {retries} allocation retries (cache flushes)" if retries else ""),
        _ALLOCATOR_HOW)]


_ALLOCATOR_HOW = ("set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the environment before the "
                  "script starts (segments grow in place instead of splitting fixed blocks)")
