"""Exercise: a change of layout, Shard(i) -> Shard(j), by one all_to_all (lesson 21).

A tensor lies on n ranks cut along dim ``dim_from`` into torch.chunk's
pieces (ceil(L / n) each, the last shorter, trailing ones empty): rank r
holds chunk r. The student writes ``shard_to_shard(local, global_shape,
dim_from, dim_to)``, which returns this rank's chunk of ``dim_to`` instead,
every element of it, by one ``dist.all_to_all_single``: rank r sends rank
k the part of its chunk that falls in k's chunk of ``dim_to``, and joins
what arrives along ``dim_from``, in rank order.

Why this change of the table, and not S -> R: it holds all of them. Its
blocks are cut on two dims at once (the sizes of both, uneven ones
included); an all_to_all sends blocks of one size, so they travel padded to
the largest and are trimmed on arrival, which is how torch's (and
minidist's) all_gather and reduce_scatter of uneven shards work too; and
the order of the pieces is the order of the chunks. Shard -> Replicate is
the same with every block the whole of a chunk.

The checker runs it on 2 and 4 real processes (float64), five shapes on
each, uneven ones with empty chunks and a 3-D one, and compares every
rank's piece with ``DTensor.redistribute(mesh, [Shard(dim_to)])``'s in the
same launch. A wrong piece is told by its block: which rank, which global
rows and columns it should hold (with torch.chunk's sizes), and what it
holds at the first wrong element, named as the element of the tensor it is
(the tensor's values are its elements' flat indices plus one, so that a
zero is padding). Mistakes with a known cause are named (the pieces joined
in the wrong order, numpy's array_split or L // n for torch.chunk's sizes,
the padding not trimmed). Then the run's messages, from its trace: only
all_to_all, and no more bytes per rank than the plan of ``redistribute``
(:func:`minidist.distributed.tensor.redistribute.plan`): (n - 1) padded
blocks.
"""

from __future__ import annotations

import math

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.exercises.exercise import CheckResult, Exercise, Failure
from minidist.exercises.process_check import launch_checked

WORLD_SIZES = (2, 4)
#: (global shape, dim_from, dim_to) of each case; the same cases on every world size
CASES = (((8, 12), 0, 1),        # even on 2 and 4
         ((5, 7), 0, 1),         # uneven: on 4, 2, 2, 1, 0 rows and 2, 2, 2, 1 columns
         ((7, 5), 1, 0),
         ((3, 2), 0, 1),         # on 4, chunks of one element and empty ones
         ((6, 5, 3), 2, 0))      # 3-D: a dim that is neither is carried whole


# --------------------------------------------------------------------------- the reference


def _sizes(length: int, n: int) -> list[int]:
    """torch.chunk's sizes."""
    size = math.ceil(length / n) if length else 0
    return [max(0, min(size, length - i * size)) for i in range(n)]


def _along(array, dim, start, stop):
    index = [slice(None)] * array.ndim
    index[dim] = slice(start, stop)
    return array[tuple(index)]


def shard_to_shard(local, global_shape, dim_from, dim_to):
    """The reference. Cost per rank: one all_to_all of n blocks of
    ceil(L_from / n) x ceil(L_to / n) x (the other dims), (n - 1) of them
    sent: (n - 1)/n of this rank's padded piece, (n - 1)/n^2 of the padded whole."""
    n, me = dist.get_world_size(), dist.get_rank()
    rows, columns = _sizes(global_shape[dim_from], n), _sizes(global_shape[dim_to], n)
    starts = np.cumsum([0] + columns)
    block = list(local.shape)
    block[dim_from], block[dim_to] = max(rows), max(columns)   # every block padded to the largest
    send = np.zeros([n] + block, local.dtype)
    for k in range(n):        # to rank k: the part of my chunk in k's chunk of dim_to
        part = _along(local, dim_to, starts[k], starts[k + 1])
        send[k][tuple(slice(0, s) for s in part.shape)] = part
    received = np.empty_like(send)
    dist.all_to_all_single(received, send)
    pieces = [_along(_along(received[k], dim_from, 0, rows[k]), dim_to, 0, columns[me])
              for k in range(n)]                               # trimmed, in rank order
    return np.ascontiguousarray(np.concatenate(pieces, axis=dim_from))


# --------------------------------------------------------------------------- the run


def _whole(shape):
    """The tensor: each element its flat index plus one (0 is padding)."""
    return np.arange(1, int(np.prod(shape)) + 1, dtype=np.float64).reshape(shape)


def _worker(function):
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Shard, distribute_tensor
    from minidist.distributed.tensor.redistribute import plan

    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    found = []
    for index, (shape, dim_from, dim_to) in enumerate(CASES):
        x = distribute_tensor(_whole(shape), mesh, [Shard(dim_from)], src_data_rank=None)
        local = np.array(x.to_local().data)
        with trace.region(f"case {index}"):
            got = function(local.copy(), tuple(shape), dim_from, dim_to)
        want = np.array(x.redistribute(mesh, [Shard(dim_to)]).to_local().data)
        found.append((None if got is None else np.asarray(got), want,
                      plan(x, [Shard(dim_to)]).nbytes))
    return found


def _traffic(events, case: int, n: int):
    """{rank: (bytes sent, {collective names})} inside the trace region of ``case``."""
    found = {}
    regions = {e["rank"]: e for e in events if e["kind"] == "compute"
               and e["label"] == f"case {case}"}
    for rank, region in regions.items():
        inside = [e for e in events if e["rank"] == rank and region["start"] <= e["start"]
                  and e["end"] <= region["end"]]
        calls = [trace.label_info(e["label"]) for e in inside if e["kind"] == "collective"]
        names = {str(info.get("collective", "?")) for info in calls}
        # What the student handed over, whatever the algorithm: Bruck's all_to_all (which
        # "auto" takes for small equal pieces) forwards other ranks' pieces on the way, so
        # its messages are counted as the n - 1 pieces it was given for other ranks.
        bruck = {int(info.get("call", -1)): int(info["count"]) * int(info["itemsize"])
                 * (n - 1) // n for info in calls if info.get("algorithm") == "bruck"}
        sent = sum(bruck.values()) + sum(
            e["bytes"] for e in inside if e["kind"] == "send" and e["peer"] != rank
            and int(trace.label_info(e["label"]).get("call", -2)) not in bruck)
        if any(e["kind"] == "send" for e in inside) and not names:
            names = {"send/recv"}
        found[rank] = (sent, names)
    return found


def check(function, **options) -> CheckResult:
    report = CheckResult("redistribute_layout")
    for n in WORLD_SIZES:
        launched, failure = launch_checked(_worker, n, (function,), "shard_to_shard",
                                           events=True)
        if failure is not None:
            report.failure = _explain(failure)
            return report
        results, events = launched
        for case in range(len(CASES)):
            failure = _judge(n, case, [result[case] for result in results], events)
            if failure is not None:
                report.failure = failure
                return report
    worlds = " and ".join(map(str, WORLD_SIZES))
    report.passed += [
        f"real processes (pipe, float64), {worlds} ranks, {len(CASES)} shapes each (uneven "
        "chunks, empty ones, a 3-D tensor): every rank's piece equals "
        "DTensor.redistribute(mesh, [Shard(dim_to)])'s",
        "one all_to_all per change, and no more bytes per rank than redistribute's plan"]
    return report


def _explain(failure: Failure) -> Failure:
    if failure.kind == "raised" and "equal division" in failure.message:
        failure.message += (
            "\nnp.split cuts only into equal parts, and a dim of L elements on n ranks is "
            "cut as torch.chunk cuts it: ceil(L / n) each, the last ones shorter or empty "
            "(5 on 4 ranks: 2, 2, 1, 0)")
    return failure


# --------------------------------------------------------------------------- the verdict


def _case_text(n, case):
    shape, dim_from, dim_to = CASES[case]
    return (f"Shard({dim_from}) -> Shard({dim_to}) of a {shape} tensor on {n} ranks "
            f"(torch.chunk's sizes: dim {dim_from}: {', '.join(map(str, _sizes(shape[dim_from], n)))}; "
            f"dim {dim_to}: {', '.join(map(str, _sizes(shape[dim_to], n)))})")


def _box_text(shape, dim, start, length):
    """The global box of a chunk of ``dim``: "rows 2-3, all columns"."""
    words = ("rows", "columns", "dim 2 indices", "dim 3 indices")
    parts = []
    for d in range(len(shape)):
        name = words[d] if d < len(words) else f"dim {d} indices"
        if d != dim:
            parts.append(f"all {name}")
        elif length == 0:
            parts.append(f"no {name} (an empty chunk)")
        elif length == 1:
            parts.append(f"{name[:-1] if name.endswith('s') else name} {start}")
        else:
            parts.append(f"{name} {start}-{start + length - 1}")
    return ", ".join(parts)


def _element(value, shape) -> str:
    if value == 0:
        return "0, padding (no element of the tensor)"
    if value != int(value) or not 1 <= value <= int(np.prod(shape)):
        return f"{value:g}, no element of the tensor"
    return f"element {tuple(int(i) for i in np.unravel_index(int(value) - 1, shape))}"


def _judge(n, case, answers, events) -> Failure | None:
    shape, dim_from, dim_to = CASES[case]
    columns = _sizes(shape[dim_to], n)
    for rank, (got, want, _) in enumerate(answers):
        start = sum(columns[:rank])
        should = (f"{_case_text(n, case)}: rank {rank} should return its chunk of dim "
                  f"{dim_to}, the tensor's {_box_text(shape, dim_to, start, columns[rank])}, "
                  f"shape {want.shape}")
        if got is None or got.shape != want.shape:
            what = "None" if got is None else f"shape {got.shape}"
            return Failure("wrong shape", f"{should}; it returned {what}"
                           + _shape_hint(got, want, n, case, rank), rank=rank)
        wrong = np.flatnonzero(got != want)
        if wrong.size:
            at = tuple(int(i) for i in np.unravel_index(int(wrong[0]), want.shape))
            where = list(at)
            where[dim_to] += start
            return Failure("wrong result", (
                f"{should}. At its local index {at}, global {tuple(where)}, it holds "
                f"{_element(got[at], shape)} instead of {_element(want[at], shape)}"
                + _value_hint(got, want, n, case)), rank=rank, element=int(wrong[0]))
    traffic = _traffic(events, case, n)
    budget = max(answer[2] for answer in answers)
    for rank in sorted(traffic):
        sent, names = traffic[rank]
        others = sorted(names - {"all_to_all"})
        if others:
            return Failure("wrong collective", (
                f"{_case_text(n, case)}: every piece is right, but rank {rank} used "
                f"{', '.join(others)}: a change from one Shard to another is one all_to_all "
                "(dist.all_to_all_single), each rank sending each other rank only the part "
                "of its chunk that falls in that rank's chunk; an all_gather sends every rank "
                "the whole chunk, n times what it needs"), rank=rank)
        if sent > budget:
            return Failure("wasteful", (
                f"{_case_text(n, case)}: every piece is right, but rank {rank} sent {sent} B; "
                f"redistribute's plan sends {budget} B per rank: n - 1 blocks of "
                f"ceil(L_from / n) x ceil(L_to / n), padded to the largest chunk "
                f"({sent / budget:.1f} x). Send rank k only the part of your chunk in its "
                f"chunk of dim {dim_to}, not your whole chunk"), rank=rank)
    return None


def _shape_hint(got, want, n, case, rank) -> str:
    shape, dim_from, dim_to = CASES[case]
    if got is None:
        return ": return the array"
    if got.ndim != want.ndim:
        return ""
    sizes_to = _sizes(shape[dim_to], n)
    length = shape[dim_to]
    hints = []
    if got.shape[dim_from] != want.shape[dim_from]:
        if got.shape[dim_from] == n * max(_sizes(shape[dim_from], n)):
            hints.append(f"along dim {dim_from} it is {n} padded blocks of "
                         f"{max(_sizes(shape[dim_from], n))}: trim each piece that arrives to "
                         f"its sender's chunk of dim {dim_from} before joining them")
        else:
            hints.append(f"along dim {dim_from} it should be the whole {shape[dim_from]}: "
                         "the pieces of every rank, joined")
    if got.shape[dim_to] != want.shape[dim_to]:
        split = [len(part) for part in np.array_split(np.arange(length), n)]
        if got.shape[dim_to] == max(sizes_to):
            hints.append(f"along dim {dim_to} it is padded to the largest chunk, "
                         f"{max(sizes_to)}: trim the padding after the all_to_all (your chunk "
                         f"has {sizes_to[rank]})")
        elif got.shape[dim_to] == split[rank]:
            hints.append(f"along dim {dim_to} it has numpy's array_split size "
                         f"({', '.join(map(str, split))}), not torch.chunk's "
                         f"({', '.join(map(str, sizes_to))}): ceil(L / n) each, the last "
                         "ones shorter or empty")
        elif got.shape[dim_to] == length // n:
            hints.append(f"along dim {dim_to} it has L // n = {length // n}, which drops the "
                         f"remainder; torch.chunk's sizes are {', '.join(map(str, sizes_to))}")
        elif got.shape[dim_to] == length:
            hints.append(f"along dim {dim_to} it is the whole dim: keep your chunk only")
    return (": " + "; ".join(hints)) if hints else ""


def _value_hint(got, want, n, case) -> str:
    shape, dim_from, dim_to = CASES[case]
    rows = _sizes(shape[dim_from], n)
    if np.any(got == 0) and not np.any(want == 0):
        split = [len(part) for part in np.array_split(np.arange(shape[dim_from]), n)]
        if split != rows:
            return (f": a zero is padding, left in the piece: a piece that arrived was "
                    f"trimmed to another size than its sender's chunk. torch.chunk cuts dim "
                    f"{dim_from} into {', '.join(map(str, rows))} (ceil(L / n) each, the last "
                    f"ones shorter or empty); numpy's array_split would cut "
                    f"{', '.join(map(str, split))}")
        return ": a zero is padding, left in the piece (trim each piece to its chunk's size)"
    starts = np.cumsum([0] + rows)
    blocks = [(k, starts[k], starts[k + 1]) for k in range(n) if rows[k]]
    if sorted(got.reshape(-1).tolist()) == sorted(want.reshape(-1).tolist()):
        # the right elements, in another order: which block went where?
        for k, a, b in blocks:
            if not np.array_equal(_along(got, dim_from, a, b), _along(want, dim_from, a, b)):
                at = _box_text(shape, dim_from, a, b - a).split(", ")[dim_from]
                return (f": it holds the right elements in the wrong places; along dim "
                        f"{dim_from} the pieces are out of order: the piece from rank "
                        f"{k} belongs at {at} (rank k's "
                        f"piece goes k-th)")
    return ""


EXERCISE = Exercise(
    name="redistribute_layout", function="shard_to_shard",
    summary="Shard(i) -> Shard(j): one all_to_all of padded blocks, uneven chunks included",
    lesson="lessons/21_layouts.py", reference=shard_to_shard, check=check)
