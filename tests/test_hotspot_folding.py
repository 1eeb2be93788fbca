"""``layers --depth``: folding sums saved bytes, never time or calls (a parent's forward time
already holds its children's). Checked on a real run of examples/tiny_gpt.py."""

from __future__ import annotations

import json

import pytest

from conftest import cli
from memscope.analysis.hotspots import hotspots
from shared_runs import shared_attach


@pytest.fixture(scope="module")
def layers(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[dict]]:
    # the 8-step run at default options (step 1 profiled) the dashboard, layers, ranks and OOM
    # tests read, made once per session (tests/shared_runs.py)
    db, out = shared_attach(tmp_path_factory, [], ["examples/tiny_gpt.py", "--steps", "8"])
    assert out.returncode == 0, out.stderr
    flat = cli("layers", str(db), "--json")
    folded = cli("layers", str(db), "--depth", "1", "--json")
    assert flat.returncode == 0 and folded.returncode == 0, flat.stderr + folded.stderr
    return json.loads(flat.stdout)["modules"], json.loads(folded.stdout)["modules"]


def test_a_folded_container_is_timed_by_its_top_children(layers: tuple[list[dict], list[dict]]) -> None:
    flat, folded = layers
    by = {m["module"]: m for m in flat}
    fold = {m["module"]: m for m in folded}
    root = by[""]
    # blocks is a ModuleList (never called): its row is blocks.0 + blocks.1, not every descendant
    blocks = fold["blocks"]
    tops = [by["blocks.0"], by["blocks.1"]]
    assert blocks["forward_s"] == pytest.approx(sum(m["forward_s"] for m in tops))
    assert blocks["calls"] == sum(m["calls"] for m in tops) == 2
    assert blocks["backward_s"] == pytest.approx(sum(m["backward_s"] for m in tops))
    assert blocks["output_bytes"] == sum(m["output_bytes"] for m in tops)
    # the symptom: a folded row slower than the whole model's forward
    assert blocks["forward_s"] <= root["forward_s"]
    # saved bytes are each module's own, so folding sums them all
    assert blocks["activation_bytes"] == sum(m["activation_bytes"] for m in flat
                                             if m["module"].startswith("blocks."))
    # a module that ran keeps its own numbers
    assert fold["head"]["forward_s"] == by["head"]["forward_s"]
    assert sum(m["activation_bytes"] for m in folded) == sum(m["activation_bytes"] for m in flat)


def test_fold_without_any_own_row() -> None:
    # nothing of "enc" ran itself and enc.0 holds enc.0.fc: only enc.0 and enc.1 describe enc
    rows = [dict(module="enc.0", type="B", saved_bytes=1, output_bytes=4, forward_s=0.5, calls=1),
            dict(module="enc.0.fc", type="L", saved_bytes=2, output_bytes=4, forward_s=0.4, calls=3),
            dict(module="enc.1", type="B", saved_bytes=4, output_bytes=4, forward_s=0.25, calls=1)]
    (enc,) = hotspots(rows, 1)
    assert (enc.module, enc.activation_bytes, enc.forward_s, enc.calls, enc.output_bytes) == \
        ("enc", 7, 0.75, 2, 8)
