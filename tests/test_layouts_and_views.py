"""Every tensor counted by what it keeps (issue 36, item 4): sparse tensors (COO, CSR) are
counted in inventories and in the out-of-memory census by their index and value storages, in
groups of their own layout (a sparse gradient among the gradients); a saved view is charged what
it keeps beyond what is alive elsewhere: the layer profiler charges a slice of the corpus that an
embedding saves its own extent (pytorch/examples' word_language_model charged the embedding the
whole corpus), and an inventory does not charge a kept graph the storage of a live tensor it
saved a view of (that tensor is counted where it is)."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

from conftest import SCRIPTS, cli, memscope
from memscope.agent.collectors.inventory import LiveTensors, take_inventory


def _storages(t: torch.Tensor) -> dict[int, int]:
    """A sparse tensor's storages by address (CSR made from COO shares its values)."""
    parts = (t._indices(), t._values()) if t.layout is torch.sparse_coo else (
        t.crow_indices(), t.col_indices(), t.values())
    return {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in parts}


def _parts(t: torch.Tensor) -> int:
    return sum(_storages(t).values())


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_tensors_in_an_inventory(live: LiveTensors) -> None:
    emb = nn.Embedding(50, 4, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    emb(torch.tensor([1, 2, 3])).sum().backward()
    opt.step()
    idx = torch.tensor([[0, 1, 2], [2, 0, 1]])
    coo = [torch.sparse_coo_tensor(idx, torch.ones(3) * k, (8, 8), check_invariants=True).coalesce()
           for k in range(3)]
    csr = [c.to_sparse_csr() for c in coo]
    gc.collect()
    inv = take_inventory(live, [opt])
    groups = {(sig[0], sig[1], sig[2]): g for sig, g in inv.groups.items()}
    g = groups[("other", "float32 sparse_coo", "[8, 8]")]
    assert (g.count, g.bytes) == (3, sum(_parts(c) for c in coo))
    g = groups[("other", "float32 sparse_csr", "[8, 8]")]
    coo_storages = {k for c in coo for k in _storages(c)}
    own = {k: n for c in csr for k, n in _storages(c).items() if k not in coo_storages}  # each storage once
    assert (g.count, g.bytes) == (3, sum(own.values()))
    grad = emb.weight.grad
    assert grad is not None and grad.layout is torch.sparse_coo
    assert groups[("gradients", "float32 sparse_coo", "[50, 4]")].bytes == _parts(grad)
    assert ("other", "float32", "[8, 8]") not in groups  # not taken for its dense twin


def test_a_kept_graph_that_saved_a_slice_of_a_live_tensor(live: LiveTensors) -> None:
    """An embedding's outputs kept every step, each saving its batch's indices: a slice of the
    corpus, which is alive as a tensor of its own. The corpus is counted once, in its group; the
    kept outputs' graphs are not charged it."""
    corpus = torch.randint(0, 10, (10_000, 4))  # 320,000 bytes
    emb = nn.Embedding(10, 8)
    gc.collect()
    before = take_inventory(live, [])
    kept = [emb(corpus[i:i + 5]) for i in range(0, 60, 5)]  # 12 graphs, each saving a view
    gc.collect()
    inv = take_inventory(live, [])
    groups = {(sig[0], sig[2], sig[5]): g for sig, g in inv.groups.items()}
    assert groups[("other", "[10000, 4]", None)].bytes == corpus.untyped_storage().nbytes()
    out = groups[("activations", "[5, 4, 8]", "EmbeddingBackward0")]
    assert out.count == len(kept) and out.graph_bytes == 0
    assert (inv.bytes + inv.graph_bytes) - (before.bytes + before.graph_bytes) == \
        sum(t.untyped_storage().nbytes() for t in kept)


def test_the_census_counts_sparse_tensors() -> None:
    from memscope.agent.collectors.oom_census import census

    gc.collect()
    before = census("cpu", [], [])
    assert before is not None
    kept = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.ones(2), (4, 4)).coalesce()
    after = census("cpu", [], [])
    assert after is not None and after["other"] - before["other"] == _parts(kept)


@pytest.fixture(scope="module")
def views_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("views") / "run.db"
    out = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "saved_views.py"))
    assert out.returncode == 0, out.stderr
    return db


def test_an_embedding_is_charged_its_slice_not_the_corpus(views_run: Path) -> None:
    doc: dict[str, Any] = json.loads(cli("layers", str(views_run), "--json").stdout)
    (emb,) = [m for m in doc["modules"] if m["module"] == "emb"]
    assert emb["activation_bytes"] == 35 * 20 * 8  # the batch's indices, not 50,000 x 20 x 8
