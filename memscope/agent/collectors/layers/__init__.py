"""Per-layer activation accounting, on profiled steps only, in parts with one job each.

* :mod:`.profiler`: :class:`LayerProfiler`, the step's life cycle and the per-thread stack of
  running modules (forward time, calls, output bytes; who saved what, checkpoint regions; CUDA
  allocator deltas);
* :mod:`.hooks`: where its forward hooks go (global, or per module around ``torch.compile``);
* :mod:`.saved`: the saved-tensors hooks: each storage autograd saves, once, and the live bytes;
* :mod:`.micro`: micro-batches, and which one's stats become the rows;
* :mod:`.backward`: backward time per module, from hooks on graph nodes;
* :mod:`.names`: the models seen and their modules' names;
* :mod:`.breakdown`: parameters, gradients, optimizer state and activations of the step;
* :mod:`.stats`, :mod:`.tensors`: the row type; small bounded reads of tensors.

Between profiled steps every hook is removed, so PyTorch's no-hook fast path returns.
"""

from memscope.agent.collectors.layers.backward import MAX_BACKWARD_HOOKS
from memscope.agent.collectors.layers.profiler import LayerProfiler
from memscope.agent.collectors.layers.stats import NO_MODULE, ModuleStats
from memscope.agent.collectors.layers.tensors import tensor_tree_bytes

__all__ = ["MAX_BACKWARD_HOOKS", "NO_MODULE", "LayerProfiler", "ModuleStats", "tensor_tree_bytes"]
