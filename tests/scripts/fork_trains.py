"""Children made with ``os.fork`` that train, each ending with ``os._exit`` as forked children do
(tests/test_nothing_lost.py). The first is forked before this process imports torch and imports
it itself (memscope's bootstrap, inherited, starts an agent there: a process of its own, whose
rows must be in the file though ``os._exit`` runs no exit handler); then this process imports
torch and forks a second, which trains with the torch it inherited (the parent's agent is off in
a child: the run must say that a child trained unrecorded). Each child trains 4 steps."""

import os
import sys


def train() -> None:
    import torch

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def child() -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            train()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    first = child()
    import torch  # noqa: F401 - the parent's agent starts here

    second = child()
    sys.exit(first or second)
