"""torch.compile: ``compile.py OUT VARIANT [VARIANT ...]``, the variants one after another in
one process (8 steps each, numbered on: the second variant's steps are 8-15), each on a fresh
model, with Dynamo's code caches and counters cleared before each but the first, so each
compiles its own graphs and saves its own counts. One process pays for importing torch and
Dynamo once.

fullgraph  aot_eager, fullgraph=True (a hook Dynamo cannot trace fails the run)
dynamic    aot_eager, dynamic=True, a batch size that changes every step
submodule  aot_eager on one submodule only, with a graph break inside it
inductor   the default backend (Inductor: C++ built with the machine's compiler)
function   aot_eager on a function that calls the model (no compiled module), evaluated under
           no_grad mid-run (a second graph, compiled during a step)
inplace    aot_eager in place: model.compile()
"""

import gc
import io
import sys
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import dynamo_counters, finish, seed

out, variants = sys.argv[1], sys.argv[2:]
STEPS = 8


class Body(nn.Module):
    def __init__(self, graph_break: bool) -> None:
        super().__init__()
        self.graph_break = graph_break
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.norm(h + self.fc2(h))


class Net(nn.Module):
    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.body = Body(graph_break)
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(torch.relu(self.embed(x))))


def train(variant: str, first: bool) -> dict[str, Any]:
    if not first:  # the first one imports Dynamo by compiling, as a script alone does
        # compiled code and the automatic-dynamic state dropped (torch._dynamo.reset() would also
        # unregister every compile start/end callback: memscope's shield among them)
        torch._dynamo.reset_code_caches()
        torch._dynamo.utils.counters.clear()
        # and the last variant's model gone, as in a script of its own (model.compile() makes a
        # reference cycle): a second model alive would be named apart by its class ("Net.body")
        gc.collect()
    seed()
    model = Net(graph_break=variant == "submodule")
    if variant == "fullgraph":
        run = torch.compile(model, backend="aot_eager", fullgraph=True)
    elif variant == "dynamic":
        run = torch.compile(model, backend="aot_eager", dynamic=True)
    elif variant == "submodule":
        model.body = torch.compile(model.body, backend="aot_eager")
        run = model
    elif variant == "inductor":
        run = torch.compile(model)
    elif variant == "function":
        @torch.compile(backend="aot_eager", fullgraph=True)
        def run(x: torch.Tensor) -> torch.Tensor:
            return model(x)
    elif variant == "inplace":
        model.compile(backend="aot_eager")
        run = model
    else:
        raise SystemExit(f"unknown variant {variant}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        batch = 8 + 2 * step if variant == "dynamic" else 8
        x, y = torch.randn(batch, 16), torch.randint(0, 4, (batch,))
        loss = F.cross_entropy(run(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())  # a float: keeping the tensor would be a leak
        if step == 4:
            with torch.no_grad():  # evaluation mid-run: not a step; compiled now (no_grad variant)
                run(torch.randn(8, 16))
    with torch.no_grad():  # evaluation: not a step
        run(torch.randn(8, 16))
    # the parameters as bytes until the end: tensors kept from variant to variant would grow
    # every 8 steps (a leak memscope rightly reports)
    params = io.BytesIO()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, params)
    return {"losses": losses, "dynamo": dynamo_counters(), "params": params.getvalue()}


def params_of(result: dict[str, Any]) -> Any:
    return torch.load(io.BytesIO(result["params"]), weights_only=True)


results = {variant: train(variant, i == 0) for i, variant in enumerate(variants)}
if len(variants) == 1:  # as one case alone always saved it
    (only,) = results.values()
    finish(out, only["losses"], params_of(only), dynamo=only["dynamo"])
else:
    finish(out, [x for r in results.values() for x in r["losses"]],
           {v: params_of(r) for v, r in results.items()},
           dynamo={v: r["dynamo"] for v, r in results.items()})
