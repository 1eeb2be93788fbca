"""Leak: a cache kept in a class attribute, shared by every instance and never evicted.

    memscope attach examples/leaks/class_cache.py && memscope leaks RUN.db

At default options it is reported by step 5, and by step 7 with its holder
(``__main__.EmbeddingCache.store``) and the line that stores it.
"""

import torch
import torch.nn.functional as F

from _common import batch, model_for, parse


class EmbeddingCache:
    store = {}  # the leak: keyed by step, so every step adds an entry

    def put(self, key, value):
        EmbeddingCache.store[key] = value.detach().clone()


if __name__ == "__main__":
    args = parse(__doc__)
    model = model_for(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cache = EmbeddingCache()
    for step in range(args.steps):
        x, y = batch(args.batch, args.width)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        cache.put(step, x[:, :64])
    print(f"cache holds {len(EmbeddingCache.store)} entries")
