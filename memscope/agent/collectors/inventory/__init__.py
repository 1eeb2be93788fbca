"""Tensor inventories at step boundaries (leak detection inside the training process).

One job per module:

* :mod:`.live`: which tensors are alive (a registry fed by the gc, not a walk over every object);
* :mod:`.graph`: what live autograd graphs keep alive (saved tensors, retained nodes);
* :mod:`.scan`: one inventory, tensors counted per signature;
* :mod:`.holders`: who holds a suspect group (a name a person can read);
* :mod:`.suspects`: which groups get the holder search and creation-site capture;
* :mod:`.schedule`: when the next inventory is due.

:mod:`memscope.agent.collectors.leak_collector` wires them to the agent and writes the rows.
"""

from memscope.agent.collectors.inventory.holders import find_holder, find_holders
from memscope.agent.collectors.inventory.live import LiveTensors
from memscope.agent.collectors.inventory.scan import (Group, Inventory, Signature, forget_kinds, signature,
                                                      take_inventory)
from memscope.agent.collectors.inventory.schedule import Schedule
from memscope.agent.collectors.inventory.suspects import Suspects

__all__ = ["Group", "Inventory", "LiveTensors", "Schedule", "Signature", "Suspects", "find_holder", "forget_kinds",
           "find_holders", "signature", "take_inventory"]
