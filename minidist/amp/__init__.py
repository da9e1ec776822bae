"""minidist.amp: mixed precision training, float16 compute with float32
master weights and dynamic loss scaling (Micikevicius et al., 2018).

    from minidist import amp

    model = build_model().half()               # float16 weights and activations
    masters = amp.MasterWeights(model)         # float32 copies the optimizer steps
    optimizer = optim.SGD(masters.parameters(), lr=0.1)
    scaler = amp.GradScaler()                  # torch.amp.GradScaler's rules

Files, one idea each:

* ``grad_scaler.py``: GradScaler: scale the loss, unscale the gradients,
  skip a step whose gradients overflowed, grow and back off the scale
* ``master_weights.py``: MasterWeights: the float32 copies, the two copies
  per step, and why minidist does this instead of torch's autocast
* ``bfloat16.py``: round_to_bfloat16: bfloat16's numbers on float32 arrays
  (minidist has no bfloat16 dtype; ``Module.bfloat16()`` says why)

What loss scaling prevents is measured in
:mod:`minidist.experiments.mixed_precision`.
"""

from minidist.amp.bfloat16 import round_to_bfloat16
from minidist.amp.grad_scaler import GradScaler
from minidist.amp.master_weights import MasterWeights

__all__ = ["GradScaler", "MasterWeights", "round_to_bfloat16"]
