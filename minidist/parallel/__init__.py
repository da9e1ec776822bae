"""minidist.parallel: one file per way of training on many ranks.

``from minidist.parallel import DistributedDataParallel`` works as in torch
(``torch.nn.parallel.DistributedDataParallel``); every other strategy is
imported from its own file (``minidist.parallel.zero``, ``.pipeline``, ...).
"""

from minidist.parallel.data_parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
