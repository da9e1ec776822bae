"""minidist.distributed: processes, groups and messages, torch.distributed style.

    import minidist.distributed as dist

    def worker():
        rank, size = dist.get_rank(), dist.get_world_size()
        x = np.full(4, rank, np.float32)
        if rank == 0:
            dist.send(x, dst=1, tag=7)
        elif rank == 1:
            dist.recv(x, src=0, tag=7)          # fills x in place
        return x

    minidist.launch(worker, world_size=2, transport="shm")

Where things are:

* :mod:`.launch`         ``minidist.launch`` and ``minidist run``: joins the transports,
  the world and the process runtime below (:mod:`minidist.runtime`: the supervisor,
  the control block, errors, signals, console); :mod:`.worker` a forked worker's life
* :mod:`.world`          init / destroy, rank, world size, ``new_group``
* :mod:`.process_group`  ``ProcessGroup``: ranks, contexts, point-to-point calls
* :mod:`.agreement`      ``agree``: ranks check that they pass the same value (a mesh's
  shape, a pipeline's schedule); the odd rank is named
* :mod:`.shown_calls`    ``shown_call``: ranks show their call's shape in the control block
  (no message); a message that does not fit is judged by them, the odd rank named
* :mod:`.device_mesh`    ``init_device_mesh``, ``DeviceMesh``: the ranks as an n-D array,
  a group per slice along each dimension (torch's ``torch.distributed.device_mesh``)
* :mod:`.torch_names`    torch's ``group.WORLD``, ``GroupMember``, ``Backend``,
  ``new_subgroups``, ``get_process_group_ranks``, ``is_available``, ... in minidist's terms
* :mod:`.point_to_point` the module-level forms of those calls (``group=None`` is the world)
* :mod:`.collectives`    broadcast, reduce, all_reduce, ...: every algorithm by name; the
  ``*_object`` forms for Python objects; ``monitored_barrier``
* :mod:`.simulator`      ``simulate``: a collective on many ranks in one process, on a
  virtual clock (the "sim" transport), with a trace to draw
* :mod:`.transport`      how bytes move (``pipe``, ``shm``) and the progress engine
* :mod:`.fast_paths`     every shortcut taken for speed (small messages, shared slots,
  the one-shot lane), and ``MINIDIST_FAST_PATHS=0`` to turn them off
* :mod:`.device_arrays`  GPU (CuPy) arrays staged through host memory, once CuPy is
  the array backend
* :mod:`.shared_array`   ``shared_array(name)``: arrays every rank maps, declared at launch

For the layers above: a collective is written with the point-to-point calls of
``group.with_context("its name")``, so its messages live in a tag space of
their own; ``recv_reduce`` combines an incoming chunk into a buffer straight
from the transport; ``isend`` of a small message completes at once.

One thread per process talks to minidist.distributed (as with MPI's
THREAD_FUNNELED): the progress engine has no locks.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

# Imported at once: light (no NumPy), and `shared_array` must be: it is also
# the name of a submodule, and importing a submodule binds its name in this
# package, so the function must be bound after the module's first import.
from minidist.distributed.shared_array import shared_array
from minidist.distributed.world import (
    DEFAULT_TIMEOUT,
    destroy_process_group,
    failed_ranks,
    finished_ranks,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
    new_group,
)
from minidist.runtime.console import print0, progress0
from minidist.runtime.errors import (
    AbortedError,
    CollectiveMismatchError,
    CommTimeoutError,
    DistributedError,
    MessageMismatchError,
    NotInitializedError,
    PeerGoneError,
    WorkerError,
)

#: Everything else, imported when first asked for (PEP 562): name -> (module,
#: name there). The messages, the collectives and the simulator bring NumPy and
#: every algorithm with them; a process that only needs the runtime (the one
#: that starts `minidist run`'s workers while they import) goes without them.
#: The collectives come from their package, where the fast paths' shortcuts
#: are installed (see collectives/one_shot_shortcut.py).
_LAZY = {name: ("minidist.distributed.collectives", name) for name in (
    "ALGORITHMS", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce",
    "all_to_all", "all_to_all_single", "barrier", "broadcast", "broadcast_object_list",
    "gather", "gather_object", "monitored_barrier", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter", "scatter_object_list")}
_LAZY.update({name: ("minidist.distributed.point_to_point", name) for name in (
    "P2POp", "batch_isend_irecv", "iprobe", "irecv", "irecv_array", "irecv_reduce", "isend",
    "probe", "recv", "recv_array", "recv_object", "recv_object_list", "recv_reduce", "send",
    "send_object", "send_object_list", "wait_all")})
_LAZY.update({name: ("minidist.distributed.transport.base", name)
              for name in ("ANY_SOURCE", "ANY_TAG", "MessageInfo")})
_LAZY.update({
    "Work": ("minidist.distributed.transport.base", "Request"),
    "ProcessGroup": ("minidist.distributed.process_group", "ProcessGroup"),
    "ReduceOp": ("minidist.distributed.reduce_op", "ReduceOp"),
    "simulate": ("minidist.distributed.simulator", "simulate"),
    "SimulationResult": ("minidist.distributed.simulator", "SimulationResult"),
    "DeviceMesh": ("minidist.distributed.device_mesh", "DeviceMesh"),
    "init_device_mesh": ("minidist.distributed.device_mesh", "init_device_mesh"),
    "agree": ("minidist.distributed.agreement", "agree"),
    "shown_call": ("minidist.distributed.shown_calls", "shown_call"),
})
_LAZY.update({name: ("minidist.distributed.torch_names", name) for name in (
    "Backend", "GroupMember", "get_process_group_ranks", "group", "is_available",
    "is_torchelastic_launched", "new_subgroups", "new_subgroups_by_enumeration")})

if TYPE_CHECKING:
    # The same names, where they are written: what an editor's go-to-definition
    # and a type checker read (never run; tests/runtime/test_lazy_imports.py
    # holds them to _LAZY).
    from minidist.distributed.agreement import agree
    from minidist.distributed.collectives.all_gather import all_gather, all_gather_into_tensor
    from minidist.distributed.collectives.all_reduce import all_reduce
    from minidist.distributed.collectives.all_to_all import all_to_all, all_to_all_single
    from minidist.distributed.collectives.barrier import barrier, monitored_barrier
    from minidist.distributed.collectives.broadcast import broadcast
    from minidist.distributed.collectives.gather import gather
    from minidist.distributed.collectives.objects import (
        all_gather_object,
        broadcast_object_list,
        gather_object,
        scatter_object_list,
    )
    from minidist.distributed.collectives.reduce import reduce
    from minidist.distributed.collectives.reduce_scatter import (
        reduce_scatter,
        reduce_scatter_tensor,
    )
    from minidist.distributed.collectives.registry import ALGORITHMS
    from minidist.distributed.collectives.scatter import scatter
    from minidist.distributed.device_mesh import DeviceMesh, init_device_mesh
    from minidist.distributed.point_to_point import (
        P2POp,
        batch_isend_irecv,
        iprobe,
        irecv,
        irecv_array,
        irecv_reduce,
        isend,
        probe,
        recv,
        recv_array,
        recv_object,
        recv_object_list,
        recv_reduce,
        send,
        send_object,
        send_object_list,
        wait_all,
    )
    from minidist.distributed.process_group import ProcessGroup
    from minidist.distributed.reduce_op import ReduceOp
    from minidist.distributed.shown_calls import shown_call
    from minidist.distributed.simulator import SimulationResult, simulate
    from minidist.distributed.torch_names import (
        Backend,
        GroupMember,
        get_process_group_ranks,
        group,
        is_available,
        is_torchelastic_launched,
        new_subgroups,
        new_subgroups_by_enumeration,
    )
    from minidist.distributed.transport.base import ANY_SOURCE, ANY_TAG, MessageInfo
    from minidist.distributed.transport.base import Request as Work

#: The modules of the calls that take arrays (see device_arrays.py).
_ARRAY_CALLS = ("minidist.distributed.collectives", "minidist.distributed.point_to_point")


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    globals()[name] = getattr(importlib.import_module(module), attribute)
    if module in _ARRAY_CALLS:
        # GPU (CuPy) arrays are staged through host memory by wrappers put in
        # place once CuPy is the array backend; NumPy's calls are the plain ones.
        from minidist.distributed import device_arrays

        device_arrays.stage_when_on_gpu(sys.modules[__name__])
    return globals()[name]  # looked up here once: later uses are plain attributes


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def world_group() -> ProcessGroup:
    """The default group (all ranks)."""
    from minidist.distributed.world import current

    return current().group


__all__ = [
    "ALGORITHMS", "CollectiveMismatchError", "all_reduce", "broadcast", "reduce",
    "ANY_SOURCE", "ANY_TAG", "AbortedError", "CommTimeoutError", "DEFAULT_TIMEOUT",
    "DistributedError", "MessageInfo", "MessageMismatchError", "NotInitializedError",
    "PeerGoneError", "ProcessGroup", "ReduceOp", "Work", "WorkerError", "barrier",
    "destroy_process_group", "get_global_rank", "get_group_rank", "get_rank",
    "get_world_size", "world_group", "init_process_group", "iprobe", "irecv", "irecv_array",
    "irecv_reduce", "is_initialized", "isend", "new_group", "print0", "probe",
    "progress0", "recv", "recv_array", "recv_object", "recv_reduce", "send", "send_object",
    "wait_all", "simulate", "SimulationResult",
]
__all__ += ["gather", "scatter", "failed_ranks", "finished_ranks", "shared_array"]
__all__ += ["all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single",
            "reduce_scatter", "reduce_scatter_tensor"]
__all__ += ["all_gather_object", "broadcast_object_list", "gather_object", "monitored_barrier",
            "P2POp", "batch_isend_irecv", "get_backend", "get_node_local_rank",
            "scatter_object_list", "send_object_list", "recv_object_list"]
__all__ += ["Backend", "GroupMember", "get_process_group_ranks", "group", "is_available",
            "is_torchelastic_launched", "new_subgroups", "new_subgroups_by_enumeration"]
__all__ += ["DeviceMesh", "init_device_mesh", "agree", "shown_call"]
