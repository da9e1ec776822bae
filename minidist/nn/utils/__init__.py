"""minidist.nn.utils: torch's ``torch.nn.utils`` helpers for gradients.

* ``clip_grad.py``: ``clip_grad_norm_``, ``clip_grad_value_``,
  ``get_total_norm`` and ``clip_grads_with_norm_`` (torch 2.6's split of
  ``clip_grad_norm_``), with torch's meaning on one process; a gradient
  whose pieces lie on several ranks (a DTensor parameter, a tensor-parallel
  shard) is summed over them by a rule its layer registers
  (``register_grad_norm_rule``), since this layer knows no collectives;
  such a layer also says the type of the returned norm
  (``register_total_norm_layout``: a DTensor's, replicated, as torch's).
"""

from minidist.nn.utils.clip_grad import (
    clip_grad_norm_,
    clip_grad_value_,
    clip_grads_with_norm_,
    get_total_norm,
    register_grad_norm_rule,
    register_total_norm_layout,
)

__all__ = ["clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm",
           "register_grad_norm_rule", "register_total_norm_layout"]
