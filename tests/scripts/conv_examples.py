"""Two pytorch/examples scripts whose mixed_precision figure was wrong, on random data, one per
argv[1] (four steps):

* ``mnist [BATCH [OPTIMIZER [MICRO [bce]]]]``: its model and loop (two convolutions, max pooling,
  dropout, a 9216 x 128 linear layer: 4.5 MiB of its 4.6 MiB of weights) with Adadelta (or
  ``adam``) at batch 16, optionally accumulated over MICRO micro-batches, its loss optionally
  an ``nn.BCELoss`` of the probabilities (dcgan's loss, which takes no bfloat16 input). The step's live
  tensors peak twice, close together: in backward (activations, gradients, states) and in the
  optimizer's step (the update's temporaries of that weight, 9 MiB, beside the states), the
  first growing with the batch. At 16 the optimizer's is 1.0 MiB higher: autocast changes
  nothing there (whatif measures a few bytes; the figure was 2.48 MiB, those temporaries
  halved as a 16-bit op's output), and SGD's saving stops at backward's peak. At 24 backward's
  is 3.0 MiB higher: autocast's 3.8 MiB off it stop at the optimizer's.
* ``dcgan``: its generator and discriminator (transposed convolutions, BatchNorm, ReLU / Tanh;
  convolutions, LeakyReLU, Sigmoid, BCELoss), two Adam optimizers, batch 8 of 64 x 64 images
  from a DataLoader, and the script's sample of the generator on fixed noise at the first batch
  (with autograd on: its graph lives on until the next batch's ``fake`` replaces it). The step
  peaks with a batch and a second graph of the generator live beside the states and saved
  activations, a working set much of which is the generator's (the figure was 2.83 MiB, 2.19
  MiB of it that working set halved). Its BCELoss takes no bfloat16 input: the
  mixed_precision trial fails at step 0, and its RSS once read as a 16.34 MiB saving.
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

case = sys.argv[1]
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16  # mnist: the batch
optimizer = sys.argv[3] if len(sys.argv) > 3 else "adadelta"  # mnist: adadelta or adam
micro = int(sys.argv[4]) if len(sys.argv) > 4 else 1  # mnist: micro-batches per optimizer step
bce = len(sys.argv) > 5 and sys.argv[5] == "bce"  # mnist: nn.BCELoss on the probabilities
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randint(0, 256, (n, 3, 64, 64), dtype=torch.uint8)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i].float().div(255), 0  # torchvision's ToTensor


if case == "mnist":
    model = Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0) if optimizer == "adadelta" \
        else torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(4):
        opt.zero_grad()
        for _ in range(micro):
            data, target = torch.rand(batch // micro, 1, 28, 28), torch.randint(0, 10, (batch // micro,))
            out = model(data)
            loss = (nn.BCELoss()(out.exp(), F.one_hot(target, 10).float()) if bce else F.nll_loss(out, target)) / micro
            loss.backward()
        opt.step()
else:
    nz, ngf, ndf = 100, 8, 8

    def up(i: int, o: int, stride: int, pad: int) -> list[nn.Module]:
        return [nn.ConvTranspose2d(i, o, 4, stride, pad, bias=False), nn.BatchNorm2d(o), nn.ReLU(True)]

    def down(i: int, o: int, norm: bool) -> list[nn.Module]:
        return [nn.Conv2d(i, o, 4, 2, 1, bias=False), *([nn.BatchNorm2d(o)] if norm else []),
                nn.LeakyReLU(0.2, inplace=True)]

    class Generator(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.main = nn.Sequential(*up(nz, ngf * 8, 1, 0), *up(ngf * 8, ngf * 4, 2, 1), *up(ngf * 4, ngf * 2, 2, 1),
                                      *up(ngf * 2, ngf, 2, 1), nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False),
                                      nn.Tanh())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.main(x)

    class Discriminator(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.main = nn.Sequential(*down(3, ndf, False), *down(ndf, ndf * 2, True), *down(ndf * 2, ndf * 4, True),
                                      *down(ndf * 4, ndf * 8, True), nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),
                                      nn.Sigmoid())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.main(x).view(-1, 1).squeeze(1)

    netG, netD = Generator(), Discriminator()
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(8, nz, 1, 1)
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    loader = torch.utils.data.DataLoader(Images(256), batch_size=8, shuffle=True)
    for i, (real, _) in zip(range(4), loader):
        netD.zero_grad()
        label = torch.full((8,), 1.0)
        errD_real = criterion(netD(real), label)
        errD_real.backward()
        fake = netG(torch.randn(8, nz, 1, 1))
        label.fill_(0.0)
        errD_fake = criterion(netD(fake.detach()), label)
        errD_fake.backward()
        optD.step()
        netG.zero_grad()
        label.fill_(1.0)
        errG = criterion(netD(fake), label)
        errG.backward()
        optG.step()
        if i % 100 == 0:
            fake = netG(fixed_noise)  # the script's sample (saved as an image there)
