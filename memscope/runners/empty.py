"""Why a run file holds no process: the agent never started anywhere in the command.

Said on stderr by ``attach`` and kept in the run file (an ``agent_missing`` event, shown in the
report's ``recording`` lines), with what to do about it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Sequence

from memscope.runners.isolated import PYTHON_NAME

_PROBE = ("import sys\ntry:\n    import memscope\n    found = 1\nexcept Exception:\n    found = 0\n"
          "print('%d.%d' % sys.version_info[:2], found)")


def why_no_agent(command: Sequence[str], without_torch: Sequence[dict[str, Any]] = ()) -> str:
    """One line: why no process of ``command`` was recorded, and what to do. ``without_torch``:
    the ``torch_missing`` events of processes whose ``import torch`` failed."""
    interpreters = list(dict.fromkeys(str((e.get("data") or {}).get("executable") or "?") for e in without_torch))
    if interpreters:
        where = interpreters[0] + (f" (and {', '.join(interpreters[1:])})" if interpreters[1:] else "")
        return (f"recording empty: torch is not installed in {where}, the Python that ran the script "
                f"(its import torch failed): install torch there ({interpreters[0]} -m pip install torch), "
                "or run memscope attach from an environment that has torch")
    program = command[0] if command else "?"
    if PYTHON_NAME.match(os.path.basename(program)) or os.path.abspath(program) == sys.executable:
        probe = _probe(program)
        ours = "%d.%d" % sys.version_info[:2]
        if probe is not None and probe[1] == 0 and probe[0] != ours:
            return (f"recording empty: {program} (Python {probe[0]}) cannot import memscope, and "
                    f"memscope's own copy is for Python {ours}: install torch-memscope into that "
                    "interpreter, or run the script with memscope's (memscope attach SCRIPT.py)")
    return ("recording empty: memscope's agent started in no process of this command (none "
            "imported torch with memscope's bootstrap: a command that clears the environment, "
            "an interpreter without memscope, or training only in processes memscope does not "
            "record); call memscope.start() where the training runs, or use a supported "
            "launcher (python SCRIPT, python -m, torchrun)")


def _probe(program: str) -> tuple[str, int] | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSCOPE_") and k != "PYTHONPATH"}
    try:
        out = subprocess.run([program, "-I", "-c", _PROBE], env=env, capture_output=True, text=True,
                             timeout=20).stdout.split()
        return out[0], int(out[1])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None
