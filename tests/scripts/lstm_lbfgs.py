"""pytorch/examples' time_sequence_prediction in plain torch (no numpy or matplotlib): two
LSTMCells and a Linear stepped over each time step of sine waves, LBFGS through a closure (up to
``--max-iter`` forward/backward passes inside each ``optimizer.step``), then a prediction under
``torch.no_grad()`` each step. An op-heavy training of few steps: thousands of module calls and
tens of thousands of ops per step. The data is made here (the example's generate_sine_wave.py)."""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn


class Sequence(nn.Module):
    def __init__(self, hidden: int = 51) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input: torch.Tensor, future: int = 0) -> torch.Tensor:
        outputs = []
        h_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        c_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        output = input[:, :1]
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):  # predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def sine_waves(n: int, length: int, period: int = 20) -> torch.Tensor:
    """generate_sine_wave.py's data: n sine waves of ``length`` points, shifted at random."""
    g = torch.Generator().manual_seed(2)
    shift = torch.randint(-4 * period, 4 * period, (n, 1), generator=g)
    x = torch.arange(length).reshape(1, length) + shift
    return torch.sin(x.double() / period)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--samples", type=int, default=100, help="sine waves (3 of them for the test)")
    p.add_argument("--length", type=int, default=1000, help="points per wave")
    p.add_argument("--future", type=int, default=1000, help="points predicted after each step")
    p.add_argument("--max-iter", type=int, default=20, help="LBFGS's closure evaluations per step")
    p.add_argument("--timings", action="store_true", help="print each step's CPU seconds (this thread)")
    args = p.parse_args()
    torch.manual_seed(0)
    data = sine_waves(args.samples, args.length)
    input, target = data[3:, :-1], data[3:, 1:]
    test_input, test_target = data[:3, :-1], data[:3, 1:]
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=args.max_iter)
    for i in range(args.steps):
        cpu = time.thread_time()
        evaluations = 0

        def closure() -> torch.Tensor:
            nonlocal evaluations
            evaluations += 1
            optimizer.zero_grad()
            loss = criterion(seq(input), target)
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        with torch.no_grad():  # predict, no need to track gradient here
            pred = seq(test_input, future=args.future)
            test_loss = criterion(pred[:, :-args.future] if args.future else pred, test_target)
        took = f" cpu {time.thread_time() - cpu:.3f} s" if args.timings else ""
        print(f"step {i} evaluations {evaluations} loss {float(loss.detach()):.6f} "
              f"test loss {float(test_loss):.6f}{took}")


if __name__ == "__main__":
    main()
