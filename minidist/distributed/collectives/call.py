"""The part every collective call shares: check the arguments, choose the
algorithm, tag the call, and run it blocking or as a :class:`~.comm.Work`.

A public collective (``all_reduce``, ``broadcast``, ...) is three lines on top
of this: turn its arguments into flat contiguous buffers, :func:`start` the
call, and :func:`execute` the algorithm's generator.
"""

from __future__ import annotations

import functools

import numpy as np

from minidist import topology
from minidist.distributed.collectives import native, nodes, registry, topology_costs
from minidist.distributed.collectives.comm import Comm, Work, completed_work, run
from minidist.distributed.collectives.fingerprints import (
    CallRecord,
    fingerprint,
    with_call_number,
)
from minidist.distributed.process_group import _as_array, rank_in_group
from minidist.distributed.reduce_op import ReduceOp, ufunc_of
from minidist.distributed.reduce_op import parse as parse_op
from minidist.distributed.transport.base import _DEFAULT
from minidist.distributed.world import group_or_world

#: Every collective's algorithms by name (see :mod:`.registry`).
ALGORITHMS = registry.ALGORITHMS


def group_of(group):
    """The group (None: the world), checked to include this rank."""
    group = group_or_world(group)
    group._require_member("take part in a collective")
    return group


def buffer_of(tensor, collective: str, rank: int, *, writeable: bool = True) -> np.ndarray:
    """The NumPy array behind ``tensor`` (an array or a minidist Tensor)."""
    array = _as_array(tensor, collective, rank)
    if writeable and not array.flags.writeable:
        raise ValueError(f"rank {rank}: {collective} writes its result into the array you pass, "
                         "but this one is read-only (a broadcast view, or np.frombuffer of "
                         "bytes?). Pass a copy: array.copy().")
    return array


def check_n_to_one(output: np.ndarray, input: np.ndarray, group, collective: str, *,
                   output_is_whole: bool, hint: str) -> None:
    """The two arrays of ``all_gather_into_tensor`` (the output holds n times
    the input's elements) and ``reduce_scatter_tensor`` (the input n times the
    output's): one dtype, and sizes that fit; ``hint`` says how to size them."""
    rank, n = group._global_rank, group.size
    if output.dtype != input.dtype:
        raise TypeError(f"rank {rank}: {collective} needs output and input of one dtype, got "
                        f"output {output.dtype} and input {input.dtype}.")
    whole, piece = (output, input) if output_is_whole else (input, output)
    if whole.size != n * piece.size:
        names = ("output", "input") if output_is_whole else ("input", "output")
        raise ValueError(f"rank {rank}: {collective} on {n} ranks needs an {names[0]} of {n} x "
                         f"{piece.size} = {n * piece.size} elements (the {names[1]} has "
                         f"{piece.size}), got {whole.size} (shape {whole.shape}). {hint}")


def per_rank_arrays(arrays, group, collective: str, list_name: str, like=None,
                    like_name: str = "tensor", writeable: bool = True) -> list[np.ndarray]:
    """A per-rank list (``tensor_list``, ``gather_list``, ``input_list``, ...) as
    NumPy arrays, checked: a list or tuple of one array per rank of
    ``group``, each shaped like ``like`` (None: any shape)."""
    rank = group._global_rank
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"rank {rank}: {collective} needs {list_name} as a list of "
                        f"{group.size} arrays (one per rank), got {type(arrays).__name__}.")
    if len(arrays) != group.size:
        raise ValueError(f"rank {rank}: {collective} needs {list_name} to hold one array per "
                         f"rank of the group, {group.size}, got {len(arrays)}.")
    checked = []
    for index, array in enumerate(arrays):
        array = buffer_of(array, f"{collective} ({list_name}[{index}])", rank,
                          writeable=writeable)
        if like is not None and (array.shape != like.shape or array.dtype != like.dtype):
            raise ValueError(f"rank {rank}: {collective} needs every array of {list_name} "
                             f"shaped like {like_name} ({like.shape} {like.dtype}), but "
                             f"{list_name}[{index}] is {array.shape} {array.dtype}.")
        checked.append(array)
    return checked


def flat_view(array: np.ndarray) -> tuple[np.ndarray, bool]:
    """A flat C-contiguous array to run the algorithm on, and whether it is a
    copy that must be written back (a strided input costs one copy each way)."""
    if array.flags.c_contiguous:
        return array.reshape(-1), False
    return np.ascontiguousarray(array).reshape(-1), True


_REDUCTIONS: dict = {}


def reduction(op, dtype: np.dtype, collective: str, rank: int):
    """(ReduceOp or ufunc, ufunc, average?) for ``op``; AVG is SUM then one division."""
    key = (op, dtype)
    known = _REDUCTIONS.get(key)
    if known is None:
        known = _check_reduction(op, dtype, collective, rank)
        if len(_REDUCTIONS) < 1024:
            _REDUCTIONS[key] = known
    return known


def _check_reduction(op, dtype: np.dtype, collective: str, rank: int):
    try:
        op = parse_op(op)
    except ValueError as error:
        raise ValueError(f"rank {rank}: {collective}: {error}") from None
    if op is ReduceOp.AVG:
        if dtype.kind not in "fc":
            raise TypeError(f"rank {rank}: {collective} with ReduceOp.AVG needs a floating "
                            f"point array, got {dtype}: an integer average would be rounded. "
                            "Use ReduceOp.SUM and divide, or convert to float first.")
        return ReduceOp.SUM, np.add, True
    ufunc = ufunc_of(op)
    if dtype == np.bool_ and op in (ReduceOp.PRODUCT,):
        raise TypeError(f"rank {rank}: {collective} with {op!r} is not defined for bool arrays; "
                        "use ReduceOp.MIN (logical and) or MAX (logical or).")
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and dtype.kind not in "biu":
        raise TypeError(f"rank {rank}: {collective} with {op!r} needs an integer or bool "
                        f"array, got {dtype}.")
    return op, ufunc, False


def choose(collective: str, algorithm: str, group, nbytes: int) -> tuple[str, int]:
    """The algorithm's name and index; "auto": the one whose registered cost is
    least; "native": the MPI library's own (see :mod:`.native`)."""
    algorithms = registry.every_algorithm(collective)
    if algorithm == native.NAME:
        native.check_available(group, collective)
        return native.NAME, native.INDEX
    if algorithm == "auto":
        algorithm = _auto(collective, group.size, nbytes, getattr(group.transport, "name", None),
                          tuple(algorithms), topology.current())
    elif algorithm not in algorithms:
        raise ValueError(f"rank {group._global_rank}: {collective} has no algorithm "
                         f"{algorithm!r}; choose one of {list(algorithms)}, 'auto', or "
                         "'native' (MPI's own, under mpiexec).")
    elif registry.needs_topology(collective, algorithm):
        nodes.check(collective, algorithm, group.size, group._global_rank)
    return algorithm, list(algorithms).index(algorithm)


@functools.lru_cache(maxsize=1024)
def _auto(collective: str, size: int, nbytes: int, transport, candidates, machine) -> str:
    """The cheapest algorithm: on a topology (``machine``) that holds the group,
    :func:`.topology_costs.best`, as the simulator's; else (or with no figure) the flat one."""
    fits = machine and size <= machine.world_size and size % machine.ranks_per_node == 0
    chosen = fits and topology_costs.best(collective, size, nbytes, machine, candidates=candidates)
    return chosen or registry.best(collective, size, nbytes, transport=transport,
                                   candidates=candidates)


def calls_of(group) -> tuple:
    """(the collectives' context of ``group``, its :class:`CallRecord`, its
    pool of scratch arrays), made once per group object. Group objects that
    share the collective context (``group`` and ``group.with_context("x")``
    have the same members) share one record, so that calls are numbered once
    per context, as the messages are matched."""
    known = getattr(group, "_collectives", None)
    if known is None:
        context_group = group.with_context("collective")
        transport = group.transport
        calls = transport.collective_groups.get(context_group.context)
        if calls is None:
            calls = CallRecord(_EveryAlgorithm(), group.ranks, context_group.context)
            # The transport asks the record when a message or a peer does not fit.
            transport.strict_contexts[context_group.context] = calls.explain
            transport.collective_groups[context_group.context] = calls
        known = group._collectives = (context_group, calls, {})
    return known


class _EveryAlgorithm:
    """ALGORITHMS with those for a machine of nodes after each collective's own,
    as the tags number them (what a mismatched call's message names)."""

    def get(self, collective, default=None):
        return registry.every_algorithm(collective) or default


_ROOTED = ("broadcast", "reduce", "gather", "scatter")


def start(collective: str, group, algorithm: str, *, nbytes: int, op=None, ufunc=None,
          dtype=None, count: int = 0, root: int = 0, buffer=None) -> Comm:
    """A :class:`Comm` for one call: the algorithm chosen, the call tagged."""
    context_group, calls, scratch_pool = calls_of(group)
    # The transport and the topology are part of the key: "auto" chooses with them.
    key = (collective, algorithm, nbytes, group.size, op, dtype, count, root,
           getattr(group.transport, "name", None),
           topology.current() if algorithm == "auto" else None)
    plan = _PLANS.get(key)
    if plan is None:
        name, index = choose(collective, algorithm, group, nbytes)
        plan = (name, fingerprint(collective, index, op, dtype, count, root, 0),
                f"{collective} {name}")
        if len(_PLANS) < 4096:  # calls repeat the same few shapes; keep the cache bounded
            _PLANS[key] = plan
    name, base_tag, prefix = plan
    if calls.error is not None:
        raise calls.error  # an earlier call of this group was mismatched
    number = calls.seq
    tag = with_call_number(base_tag, number)
    calls.seq += 1
    calls.record(number, tag, count)
    return Comm(context_group, tag, ufunc, prefix, name, calls, collective=collective,
                call=number, buffer=buffer, root=root if collective in _ROOTED else None,
                scratch_pool=scratch_pool)


_PLANS: dict = {}


def steps_of(comm: Comm):
    """The generator function of the algorithm ``comm`` runs."""
    if comm.algorithm == native.NAME:
        return native.ALGORITHMS[comm.collective]
    flat = ALGORITHMS[comm.collective]  # else one for nodes
    return flat.get(comm.algorithm) or registry.NODE_ALGORITHMS[comm.collective][comm.algorithm]


def execute(comm: Comm, steps, async_op: bool, finish=None, timeout=_DEFAULT):
    """Run ``steps`` (the algorithm's generator) now, or hand back a Work."""
    if async_op:
        comm.blocking = False  # read by the algorithm when it first runs
        return Work(steps, finish, comm)
    try:
        run(steps, timeout, comm)
    finally:
        comm.release()
    comm.record_call()
    if finish is not None:
        return finish()
    return None


def nothing_to_do(async_op: bool, result=None):
    """What a call returns when there is nothing to move (one rank, no data)."""
    return completed_work(result) if async_op else result


def check_root(root, group, collective: str, role: str = "src", group_root=None) -> int:
    """The root as a rank of ``group``: ``src=`` / ``dst=`` is a global rank (as in
    torch.distributed), ``group_src=`` / ``group_dst=`` a rank of the group;
    neither: the group's rank 0. See :func:`~..process_group.rank_in_group`."""
    return rank_in_group(group, root, group_root, role, collective)


def finish_average(flat: np.ndarray, size: int) -> None:
    np.divide(flat, size, out=flat, casting="unsafe")
