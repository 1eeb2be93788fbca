"""memscope.start() in the main thread, a training loop with a leak on a worker thread, and
memscope.stop() called from the main thread while creation-site capture is armed on the worker
(the leak made it a suspect): ``stop_from_main.py OUT``. The worker then trains on and records
whether memscope's function mode or tracer is still on its thread."""

import sys
import threading

import torch
import torch.nn as nn

import memscope
from memscope.agent.runtime import api

from _common import finish, seed

out = sys.argv[1]
memscope.start(out + ".db", force=True, inventory_every=1)
seed()
model = nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
history = []  # the leak: every step's loss tensor, and its graph
armed, stopped = threading.Event(), threading.Event()
facts = {}


def phase() -> object:
    return api._agent._leaks.sites._phase  # the test's precondition: capture is armed


def train() -> None:
    for step in range(14):
        loss = model(torch.randn(32, 64)).sum()
        history.append(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if "stack" not in facts and phase() in ("capture", "capture2"):
            facts["phase"] = phase()
            facts["stack"] = torch._C._len_torch_function_stack()
            facts["traced"] = sys.gettrace() is not None
            armed.set()
            stopped.wait()
    facts["stack_after"] = torch._C._len_torch_function_stack()
    facts["traced_after"] = sys.gettrace() is not None
    armed.set()


worker = threading.Thread(target=train)
worker.start()
armed.wait()
memscope.stop()
stopped.set()
worker.join()
finish(out, [h.item() for h in history], model, facts=facts)
