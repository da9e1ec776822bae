"""Collectives of Python objects: torch.distributed's ``*_object`` calls.

    objects = [None] * dist.get_world_size()
    dist.all_gather_object(objects, {"rank": rank, "loss": loss})   # fills the list
    config = [cfg if rank == 0 else None]
    dist.broadcast_object_list(config, src=0)                       # config[0] everywhere
    everyone = [None] * n if rank == 0 else None
    dist.gather_object(metrics, everyone, dst=0)                     # only on dst
    mine = [None]
    dist.scatter_object_list(mine, [task_of(r) for r in range(n)] if rank == 0 else None)

An object travels as its pickle: the bytes in a NumPy uint8 array, moved by
the array collectives of this package (so "auto" picks their algorithms and
the trace shows them). Pickles differ in length from rank to rank, and an
array collective needs one length, so each call is two collectives, as in
torch: first the lengths (one int64 per object), then the bytes, padded to the
longest. Cost: that of the array collective on n int64, then on n times the
longest pickle; plus pickling and unpickling every object.

Unpickling runs code: use these only between ranks you trust (your own job).
``src`` and ``dst`` are group ranks, like every collective of minidist.
"""

from __future__ import annotations

import pickle

import numpy as np

from minidist.distributed.collectives import call
from minidist.distributed.collectives.all_gather import all_gather
from minidist.distributed.collectives.broadcast import broadcast
from minidist.distributed.collectives.gather import gather
from minidist.distributed.collectives.scatter import scatter
from minidist.runtime.errors import CollectiveMismatchError


def _pickled(obj, rank: int, collective: str) -> np.ndarray:
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # pickle raises several kinds (PicklingError, TypeError, ...)
        raise TypeError(f"rank {rank}: {collective} cannot pickle {type(obj).__name__}: "
                        f"{error}. Send plain data (numbers, strings, lists, dicts, arrays) "
                        "or a class defined at a module's top level.") from None
    return np.frombuffer(data, np.uint8)


def _unpickled(data: np.ndarray):
    return pickle.loads(memoryview(data))


def _check_list(objects, length: int, rank: int, collective: str, name: str) -> None:
    if not isinstance(objects, list):
        raise TypeError(f"rank {rank}: {collective} fills {name} in place, so it must be a "
                        f"list, got {type(objects).__name__}; pass e.g. [None] * {length}.")
    if len(objects) != length:
        raise ValueError(f"rank {rank}: {collective}: {name} has {len(objects)} entries, but "
                         f"the group has {length} ranks; pass [None] * {length}.")


def _lengths_everywhere(group, payload: np.ndarray) -> np.ndarray:
    """Every rank's pickle length, on every rank (an all_gather of one int64 each)."""
    lengths = [np.empty(1, np.int64) for _ in range(group.size)]
    all_gather(lengths, np.array([payload.size], np.int64), group=group)
    return np.concatenate(lengths)


def _padded(payload: np.ndarray, length: int) -> np.ndarray:
    padded = np.zeros(length, np.uint8)
    padded[:payload.size] = payload
    return padded


def all_gather_object(object_list: list, obj, group=None) -> None:
    """Gather every rank's ``obj`` into ``object_list`` on every rank, in place:
    ``object_list[i]`` becomes (an unpickled copy of) group rank i's ``obj``.

    ``object_list`` is a list with one entry per rank of the group (its
    contents are replaced). Cost: an all_gather of n int64 (the lengths),
    then an all_gather of n x the longest pickle.
    """
    group = call.group_of(group)
    rank = group._global_rank
    _check_list(object_list, group.size, rank, "all_gather_object", "object_list")
    payload = _pickled(obj, rank, "all_gather_object")
    lengths = _lengths_everywhere(group, payload)
    longest = int(lengths.max())
    pieces = [np.empty(longest, np.uint8) for _ in range(group.size)]
    all_gather(pieces, _padded(payload, longest), group=group)
    for index, (piece, length) in enumerate(zip(pieces, lengths)):
        object_list[index] = _unpickled(piece[:length])


def gather_object(obj, object_gather_list: list | None = None, dst: int | None = None,
                  group=None, group_dst: int | None = None) -> None:
    """Every rank's ``obj`` lands in ``object_gather_list`` on rank ``dst`` (a
    global rank, as in torch.distributed; ``group_dst``: numbered within ``group``).

    On ``dst``, ``object_gather_list`` is a list with one entry per rank
    (filled in place); on the other ranks it must be None, as in
    torch.distributed. Cost: an all_gather of n int64 (every rank must know
    the longest pickle to pad to it), then a gather of n x the longest pickle.
    """
    group = call.group_of(group)
    rank = group._global_rank
    root = call.check_root(dst, group, "gather_object", "dst", group_dst)
    if group.rank == root:
        _check_list(object_gather_list, group.size, rank, "gather_object",
                    "object_gather_list")
    elif object_gather_list is not None:
        raise ValueError(f"rank {rank}: gather_object writes object_gather_list only on the "
                         f"destination rank (dst={group.ranks[root]}); pass None on the other ranks.")
    payload = _pickled(obj, rank, "gather_object")
    lengths = _lengths_everywhere(group, payload)
    longest = int(lengths.max())
    pieces = [np.empty(longest, np.uint8) for _ in range(group.size)] \
        if group.rank == root else None
    gather(_padded(payload, longest), pieces, group=group, group_dst=root)
    if group.rank == root:
        for index, (piece, length) in enumerate(zip(pieces, lengths)):
            object_gather_list[index] = _unpickled(piece[:length])


def broadcast_object_list(object_list: list, src: int | None = None, group=None,
                          device=None, group_src: int | None = None) -> None:
    """Copy rank ``src``'s ``object_list`` into ``object_list`` on every rank, in
    place, entry by entry (``src`` a global rank, as in torch.distributed;
    ``group_src``: numbered within ``group``; ``device`` is accepted for torch's
    signature and unused: objects travel as host bytes).

    Every rank passes a list of the same length (the others' entries are
    replaced; pass e.g. ``[None] * k``). Cost: a broadcast of k int64 (each
    pickle's length), then a broadcast of all k pickles end to end. A list
    of another length than the sender's raises CollectiveMismatchError.
    """
    group = call.group_of(group)
    rank = group._global_rank
    root = call.check_root(src, group, "broadcast_object_list", "src", group_src)
    if not isinstance(object_list, list):
        raise TypeError(f"rank {rank}: broadcast_object_list fills object_list in place, so "
                        f"it must be a list, got {type(object_list).__name__}; on the ranks "
                        "that receive, pass [None] * (the sender's length).")
    if group.rank == root:
        payloads = [_pickled(obj, rank, "broadcast_object_list") for obj in object_list]
        lengths = np.array([payload.size for payload in payloads], np.int64)
    else:
        lengths = np.empty(len(object_list), np.int64)
    try:
        broadcast(lengths, group=group, group_src=root)
    except CollectiveMismatchError as error:
        raise CollectiveMismatchError(
            f"rank {rank}: broadcast_object_list: object_list has {len(object_list)} entries "
            f"here, and rank {group.ranks[root]}'s (the sender's) has another length; every rank must pass "
            f"a list as long as the sender's. (The broadcast of the lengths said: {error})"
        ) from None
    data = np.concatenate(payloads) if group.rank == root and payloads else \
        np.empty(int(lengths.sum()), np.uint8)
    broadcast(data, group=group, group_src=root)
    if group.rank != root:
        ends = np.cumsum(lengths)
        for index, (end, length) in enumerate(zip(ends, lengths)):
            object_list[index] = _unpickled(data[end - length:end])


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list=None,
                        src: int | None = None, group=None,
                        group_src: int | None = None) -> None:
    """Rank ``src`` (a global rank, as in torch.distributed; ``group_src``:
    numbered within ``group``) hands ``scatter_object_input_list[r]`` to the
    group's rank r, which finds it in ``scatter_object_output_list[0]``.

    On ``src`` the input list has one object per rank; on the others it must
    be None. The output list must have at least one entry (its first is
    replaced). Cost: a broadcast of n int64 (every pickle's length: all must
    know the longest to pad to it), then a scatter of n x the longest pickle.
    """
    group = call.group_of(group)
    rank = group._global_rank
    root = call.check_root(src, group, "scatter_object_list", "src", group_src)
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError(f"rank {rank}: scatter_object_list puts this rank's object in "
                         "scatter_object_output_list[0], so it must be a list with at least "
                         "one entry; pass [None].")
    if group.rank == root:
        if not isinstance(scatter_object_input_list, (list, tuple)) or \
                len(scatter_object_input_list) != group.size:
            got = (f"{len(scatter_object_input_list)} entries"
                   if isinstance(scatter_object_input_list, (list, tuple))
                   else type(scatter_object_input_list).__name__)
            raise ValueError(f"rank {rank}: scatter_object_list: scatter_object_input_list on "
                             f"the source rank must be a list of one object per rank "
                             f"({group.size}), got {got}.")
        payloads = [_pickled(obj, rank, "scatter_object_list")
                    for obj in scatter_object_input_list]
        lengths = np.array([payload.size for payload in payloads], np.int64)
    elif scatter_object_input_list is not None:
        raise ValueError(f"rank {rank}: scatter_object_list reads scatter_object_input_list "
                         f"only on the source rank (src={group.ranks[root]}); pass None on the other ranks.")
    else:
        lengths = np.empty(group.size, np.int64)
    broadcast(lengths, group=group, group_src=root)
    longest = int(lengths.max())
    pieces = [_padded(payload, longest) for payload in payloads] if group.rank == root \
        else None
    mine = np.empty(longest, np.uint8)
    scatter(mine, pieces, group=group, group_src=root)
    scatter_object_output_list[0] = _unpickled(mine[:lengths[group.rank]])
