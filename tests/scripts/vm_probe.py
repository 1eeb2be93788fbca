"""Runs a training script as ``__main__`` and then writes this process's VmPeak and VmSize (kB, from
/proc/self/status) to the file named by VM_PROBE_OUT: the address space the training needed.

    VM_PROBE_OUT=vm.txt python tests/scripts/vm_probe.py examples/tiny_gpt.py --steps 20
"""

import os
import runpy
import sys

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
with open("/proc/self/status") as status:
    fields = dict(line.split(":", 1) for line in status if line.startswith(("VmPeak", "VmSize")))
with open(os.environ["VM_PROBE_OUT"], "w") as out:
    out.write(" ".join(f"{k}={v.split()[0]}" for k, v in sorted(fields.items())) + "\n")
