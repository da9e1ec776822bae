"""Sharding as placements: the strategies written as DTensor layouts (torch's
``torch.distributed.tensor.parallel`` and FSDP2's ``fully_shard``).

The layouts themselves, and the collective that changes one into another,
are :mod:`minidist.distributed.tensor`'s; this family puts them on modules.

Read in this order:
"""

from __future__ import annotations

__all__: list[str] = []
