"""torch's own nn.TransformerEncoder on CPU (as pytorch/examples word_language_model builds it),
with the attention dropout given in argv[1]: dropout makes scaled_dot_product_attention fall back
to its math kernel on CPU, which stores the N x N scores."""
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
S, B, E, H = 64, 16, 64, 2
layer = nn.TransformerEncoderLayer(E, H, 64, float(sys.argv[1]))
model = nn.Sequential()
model.add_module("encoder", nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mask = nn.Transformer.generate_square_subsequent_mask(S)
for step in range(6):
    x = torch.randn(S, B, E)
    loss = model[0](x, mask=mask).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
