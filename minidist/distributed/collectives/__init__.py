"""Collectives, each written by hand on point-to-point messages.

One file per collective, each holding its public call (torch.distributed's
name and in-place semantics) and its algorithms, every algorithm a generator
on :class:`~.comm.Comm`'s ``isend`` / ``irecv`` / ``irecv_reduce``, registered
with its alpha-beta-gamma cost (shown in its docstring, computed by
:mod:`minidist.costmodel`):

* :mod:`.broadcast`, :mod:`.reduce`, :mod:`.all_reduce`
* :mod:`.scatter`, :mod:`.gather`, :mod:`.barrier`
* :mod:`.all_gather`, :mod:`.reduce_scatter`, :mod:`.all_to_all`
* :mod:`.objects` Python objects (``all_gather_object``, ``broadcast_object_list``,
  ``gather_object``, ``scatter_object_list``): pickles moved by the array collectives above
* :mod:`.comm`  what an algorithm sees; the Work handle
* :mod:`.fingerprints` the tag of every call's messages; call counting and the desync checks
* :mod:`.registry` every algorithm with its cost formula and traffic; "auto"'s choice
* :mod:`.call`  what every call shares: checks, algorithm choice, running
* :mod:`.chunks` cutting a buffer into pieces
* :mod:`.nodes` which ranks share a node (``minidist.topology.current()``), and a call
  seen by some of its ranks; :mod:`.hierarchical`, :mod:`.ring_2d`, :mod:`.nccl_tree`
  the algorithms for a machine of nodes, phases of flat algorithms inside and across
* :mod:`.trees` binomial trees for any n; :mod:`.halving` recursive halving and the
  fold of a non-power-of-two world

``ALGORITHMS[collective]`` lists every algorithm by name; pass one as
``algorithm=`` or leave "auto" for the cost model's choice.

With the fast paths on (``MINIDIST_FAST_PATHS``, read at import), shortcuts are
installed over the teaching code: small sends and late-posted receives under
:class:`~.comm.Comm` from :mod:`.small_message_shortcut`, the one-shot
all_reduce's from :mod:`.one_shot_shortcut`; with them off, every name here is
the plain function and every message goes straight to the transport.
"""

from minidist.distributed import fast_paths

# The algorithms for a machine of nodes, registered after every flat one
# (their table index is part of each message's tag).
from minidist.distributed.collectives import (  # noqa: E402,F401
    hierarchical,
    nccl_tree,
    one_shot_shortcut,
    ring_2d,
    small_message_shortcut,
)
from minidist.distributed.collectives.all_gather import all_gather, all_gather_into_tensor
from minidist.distributed.collectives.all_reduce import all_reduce
from minidist.distributed.collectives.all_to_all import all_to_all, all_to_all_single
from minidist.distributed.collectives.barrier import barrier, monitored_barrier
from minidist.distributed.collectives.broadcast import broadcast
from minidist.distributed.collectives.call import ALGORITHMS
from minidist.distributed.collectives.comm import Work
from minidist.distributed.collectives.gather import gather
from minidist.distributed.collectives.objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
)
from minidist.distributed.collectives.reduce import reduce
from minidist.distributed.collectives.reduce_scatter import reduce_scatter, reduce_scatter_tensor
from minidist.distributed.collectives.scatter import scatter

if fast_paths.enabled():
    small_message_shortcut.install()
    all_reduce = one_shot_shortcut.install(all_reduce)

__all__ = ["ALGORITHMS", "Work", "all_gather", "all_gather_into_tensor", "all_reduce",
           "all_to_all", "all_to_all_single", "barrier", "broadcast", "gather", "reduce",
           "reduce_scatter", "reduce_scatter_tensor", "scatter"]
__all__ += ["all_gather_object", "broadcast_object_list", "gather_object", "monitored_barrier",
            "scatter_object_list"]
