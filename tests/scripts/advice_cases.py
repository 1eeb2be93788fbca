"""Runs whose advice was wrong before issue 36, one per argv[1]:

* ``eval``: two training steps, then an evaluation of a large batch in eval mode with autograd on
  that runs out of memory (a layer's allocation fails on a batch that large: a real allocator
  failure, as tests/scripts/batch_finder.py makes one) after the earlier layers saved their
  activations.
* ``adam0``: Adam runs out of memory while it builds its state at step 0 (the script lowers its
  own address-space limit to what is in use plus 28 MiB before the step: the small layers' state,
  16 MiB, fits; the last, largest layer's, 32 MiB a tensor, does not).
* ``gan``: a discriminator's and a generator's optimizer each step (pytorch/examples' dcgan).
* ``gan_bce``: pytorch/examples' dcgan's shape: the generator called first, a discriminator ending in
  a Sigmoid and ``nn.BCELoss`` (what autocast refuses, and a bfloat16 input cannot take).
* ``loader``: a DataLoader whose dataset applies a Normalize module (an nn.Module, as torchvision's)
  to each sample before the model sees it, and a warning the script triggers at one line every step.
"""

import resource
import sys
import warnings

import psutil
import torch
import torch.nn as nn
import torch.nn.functional as F

case = sys.argv[1]
torch.manual_seed(0)


class Wide(nn.Module):
    def forward(self, x):
        if x.shape[0] > 512:  # stands for "does not fit": a real allocator failure (800 GiB)
            torch.empty(200 << 30)
        return x


if case == "eval":
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), Wide(),
                          nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(2):
        loss = F.cross_entropy(model(torch.randn(64, 256)), torch.randint(0, 10, (64,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    logits = model(torch.randn(4096, 256))  # no torch.no_grad(): the forward saves for backward

elif case == "adam0":
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 8192))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = model(torch.randn(4, 1024)).square().mean()
    loss.backward()
    vms = psutil.Process().memory_info().vms
    resource.setrlimit(resource.RLIMIT_AS, (vms + (28 << 20), resource.RLIM_INFINITY))
    opt.step()

elif case == "gan":
    netD = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 1))
    netG = nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 64))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
    bce = nn.BCEWithLogitsLoss()
    for step in range(4):
        real = torch.randn(1024, 64)
        netD.zero_grad()
        errD_real = bce(netD(real), torch.ones(1024, 1))
        errD_real.backward()
        fake = netG(torch.randn(1024, 16))
        errD_fake = bce(netD(fake.detach()), torch.zeros(1024, 1))
        errD_fake.backward()
        optD.step()
        netG.zero_grad()
        errG = bce(netD(fake), torch.ones(1024, 1))
        errG.backward()
        optG.step()

elif case == "gan_bce":
    netG = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 64))
    netD = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1), nn.Sigmoid())
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
    bce = nn.BCELoss()
    for step in range(4):
        fake = netG(torch.randn(512, 16))
        netD.zero_grad()
        errD = bce(netD(torch.randn(512, 64)), torch.ones(512, 1)) + bce(netD(fake.detach()), torch.zeros(512, 1))
        errD.backward()
        optD.step()
        netG.zero_grad()
        errG = bce(netD(fake), torch.ones(512, 1))
        errG.backward()
        optG.step()

elif case == "loader":
    class Normalize(nn.Module):  # torchvision.transforms.Normalize is an nn.Module too
        def forward(self, x):
            return (x - 0.5) / 0.25

    class Data(torch.utils.data.Dataset):
        def __init__(self):
            self.norm = Normalize()

        def __len__(self):
            return 256

        def __getitem__(self, i):
            return self.norm(torch.rand(32)), i % 4

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 4)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in torch.utils.data.DataLoader(Data(), batch_size=32):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        warnings.warn("the learning rate schedule is deprecated", stacklevel=1)  # once per location
