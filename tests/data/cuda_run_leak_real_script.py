import argparse, torch, torch.nn as nn
p = argparse.ArgumentParser(); p.add_argument("--steps", type=int, default=200); a = p.parse_args()
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(m.parameters())
history = []
for step in range(a.steps):
    x = torch.randn(64, 512, device="cuda")
    loss = m(x).square().mean()
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    history.append(loss)   # the leak: keeps each step's loss (and graph) on the GPU
print("done", len(history))
