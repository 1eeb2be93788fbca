"""Several eager cases one after another in one process: ``several.py OUT CASE.py [CASE.py ...]``.

Each case script runs as ``__main__`` (runpy), with ``sys.argv`` as if it ran alone
(``CASE.py OUT.CASE``), and saves its own results; its steps are numbered on from the last
case's (8 per case: the second case's steps are 8-15). Between cases the last one's objects are
collected, as in a script of its own (a second model alive would be named apart by its class).
At the end the cases' results are saved together in OUT, one key per case. One process pays for
importing torch once, not once per case (tests/compat/test_eager.py).
"""

import gc
import runpy
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
out, cases = sys.argv[1], sys.argv[2:]
for case in cases:
    gc.collect()
    sys.argv = [str(HERE / case), f"{out}.{case}"]
    runpy.run_path(str(HERE / case), run_name="__main__")
gc.collect()
torch.save({case: torch.load(f"{out}.{case}", weights_only=False) for case in cases}, out)
