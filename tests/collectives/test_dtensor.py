"""The DTensor core (minidist.distributed.tensor): placements and local
shapes as torch computes them (torch.chunk's pieces, uneven included, left
to right nested cuts), and every redistribute pair on 1-D meshes of 2 and 4
ranks and on a 2x2 mesh: the values against the whole array cut by hand,
the plan's collective names against the table, its bytes against the trace's
sends, and the backward (the source's local gradient equals its piece of
the whole gradient; a Partial's is the whole). Refusals say what to do.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import minidist
from minidist import Tensor, trace
from minidist.distributed.tensor import Partial, Replicate, Shard, chunk_sizes
from minidist.distributed.tensor.placements import local_shape_and_offset


def test_chunk_sizes_are_torch_chunks():
    torch = pytest.importorskip("torch")
    for length, n in [(33, 2), (5, 4), (7, 4), (0, 3), (12, 4), (1, 2)]:
        want = [len(c) for c in torch.arange(length).chunk(n)]
        want += [0] * (n - len(want))           # torch.chunk drops trailing empty chunks
        assert chunk_sizes(length, n) == want, (length, n)


def test_nested_cuts_go_left_to_right_as_torch():
    torch = pytest.importorskip("torch")
    shape = (7, 5)
    for coordinate in itertools.product(range(2), range(2)):
        # (S(0), S(0)) on a 2x2 mesh: dim 0 cut by mesh dim 0, the piece again by mesh dim 1
        rows = torch.arange(7).chunk(2)[coordinate[0]]
        pieces = list(rows.chunk(2)) + [torch.arange(0)] * 2
        got = local_shape_and_offset(shape, (2, 2), coordinate, (Shard(0), Shard(0)))
        assert got[0] == (len(pieces[coordinate[1]]), 5)
        if len(pieces[coordinate[1]]):
            assert got[1] == (int(pieces[coordinate[1]][0]), 0)
    assert local_shape_and_offset((5, 7), (2, 2), (1, 1), (Shard(1), Shard(0))) == ((2, 3), (3, 4))


def test_placements_read_as_torchs():
    assert repr(Shard(0)) == "Shard(dim=0)" and str(Shard(1)) == "S(1)"
    assert repr(Replicate()) == "Replicate()" and str(Replicate()) == "R"
    assert repr(Partial()) == "Partial(sum)" and str(Partial("avg")) == "P(avg)"
    with pytest.raises(ValueError, match="reduces by one of"):
        Partial("prod")


PLACES = [Replicate(), Shard(0), Shard(1), Partial()]
KIND = {("S", "R"): "all_gather", ("P", "R"): "all_reduce", ("P", "S"): "reduce_scatter",
        ("R", "S"): "local chunk", ("S", "S"): "all_to_all"}
MESH_2D = [((Shard(0), Shard(1)), (Replicate(), Replicate())),
           ((Shard(0), Shard(0)), (Shard(1), Replicate())),
           ((Partial(), Shard(0)), (Replicate(), Replicate())),
           ((Replicate(), Shard(1)), (Shard(0), Shard(1))),
           ((Shard(1), Shard(0)), (Shard(0), Shard(1))),
           ((Partial(), Partial()), (Shard(0), Shard(1)))]


def _expected_local(whole, spec):
    shape, offset = spec.local_shape_and_offset()
    return whole[tuple(slice(o, o + s) for o, s in zip(offset, shape))]


def _pairs_on(mesh, pairs, label):
    import minidist.distributed as dist  # noqa: F401
    from minidist import Tensor
    from minidist.distributed.tensor import DTensorSpec, distribute_tensor, plan

    whole = np.arange(35, dtype=np.float64).reshape(5, 7) * 0.5 - 3
    grad_whole = np.random.default_rng(0).standard_normal((5, 7))
    rows = []
    for number, (src, dst) in enumerate(pairs):
        x = distribute_tensor(Tensor(whole, requires_grad=True), mesh, list(src))
        steps = plan(x, list(dst))
        with trace.region(f"{label} {number}"):
            y = x.redistribute(mesh, list(dst))
        value = float(np.abs(y.to_local().data - _expected_local(whole, y._spec)).max()) \
            if y.to_local().data.size else 0.0
        (y.full_tensor() * Tensor(grad_whole)).sum().backward()
        as_replicate = [Replicate() if isinstance(p, Partial) else p for p in src]
        want = _expected_local(grad_whole, DTensorSpec(mesh, as_replicate, (5, 7), np.float64))
        grad = float(np.abs(x.grad - want).max()) if want.size else 0.0
        rows.append(dict(src=tuple(map(str, src)), dst=tuple(map(str, dst)),
                         collectives=steps.collectives, nbytes=steps.nbytes, value=value,
                         grad=grad, region=f"{label} {number}"))
    return rows


def _core():
    import minidist.distributed as dist
    from minidist import Tensor
    from minidist.distributed.tensor import DTensor, distribute_tensor, init_device_mesh

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    pairs = [(src, dst) for src in PLACES for dst in PLACES if not isinstance(dst, Partial)]
    rows = _pairs_on(mesh, [((s,), (d,)) for s, d in pairs], "1d")
    if world == 4:
        rows += _pairs_on(init_device_mesh("cpu", (2, 2)), MESH_2D, "2d")

    def refused(attempt):
        try:
            attempt()
        except (TypeError, ValueError, RuntimeError) as error:
            return str(error)
        return None

    x = distribute_tensor(Tensor(np.ones((5, 7))), mesh, [Shard(0)])
    errors = dict(
        to_partial=refused(lambda: x.redistribute(mesh, [Partial()])),
        numpy=refused(lambda: x.numpy()),
        from_local=refused(lambda: DTensor.from_local(Tensor(np.ones((4, 7))), mesh, [Shard(0)],
                                                      shape=(5, 7)) if dist.get_rank() == 0
                           else (_ for _ in ()).throw(ValueError("rank 0 only"))),
        too_many=refused(lambda: distribute_tensor(Tensor(np.ones(3)), mesh,
                                                   [Shard(0), Shard(0)])),
    )
    return dict(rows=rows, errors=errors)


RUNS = [(2, "pipe"), (4, "shm")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dtensor_core")
    out = {}
    for world, transport in RUNS:
        path = folder / f"{world}.jsonl"
        results = minidist.launch(_core, world_size=world, transport=transport,
                                  trace=str(path), timeout=240)
        out[(world, transport)] = (results, trace.read_jsonl(path).events)
    return out


def _kind(src, dst):
    return KIND[(src[0], dst[0])] if src != dst else None


@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", RUNS)
def test_every_redistribute_pair_values_collectives_bytes_and_backward(runs, key):
    results, events = runs[key]
    for rank, result in enumerate(results):
        regions = {e["label"]: (e["start"], e["end"]) for e in events
                   if e["rank"] == rank and e["kind"] == "compute"}
        for row in result["rows"]:
            where = (rank, row["src"], row["dst"])
            assert row["value"] == 0.0, where
            assert row["grad"] < 1e-12, where
            if len(row["src"]) == 1:
                want = _kind(row["src"][0], row["dst"][0])
                assert row["collectives"] == ([want] if want else []), where
            start, end = regions[row["region"]]
            sent = sum(e["bytes"] for e in events if e["rank"] == rank and e["kind"] == "send"
                       and start <= e["start"] and e["end"] <= end)
            assert sent == row["nbytes"], where
    two_d = [row for row in results[0]["rows"] if len(row["src"]) == 2]
    if key[0] == 4:
        assert [row["collectives"] for row in two_d] == [
            ["all_gather", "all_gather"], ["all_gather", "all_gather", "local chunk"],
            ["all_gather", "all_reduce"], ["local chunk"],
            ["all_gather", "all_gather", "local chunk", "local chunk"],
            ["reduce_scatter", "reduce_scatter"]]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", RUNS)
def test_core_refusals_say_what_to_do(runs, key):
    errors = runs[key][0][0]["errors"]
    assert "internal use only" in errors["to_partial"]
    assert "full_tensor()" in errors["numpy"] and "to_local()" in errors["numpy"]
    assert errors["from_local"].startswith("rank 0:") and "pass shape=" in errors["from_local"]
    assert "takes 1 placement" in errors["too_many"]


def _whole_numbers_worker():
    from minidist.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    whole = np.arange(4.0).reshape(2, 2)
    replicated = distribute_tensor(Tensor(whole), mesh, [Replicate()])
    sharded = distribute_tensor(Tensor(whole), mesh, [Shard(0)])
    out = {"numpy": replicated.numpy().tolist(), "tolist": replicated.tolist(),
           "argmax": int(replicated.argmax()), "refused": []}
    for what, call in (("item()", lambda: sharded.item()), ("numpy()", lambda: sharded.numpy()),
                       (">", lambda: sharded > 0), ("<=", lambda: sharded <= 0),
                       ("argmax()", lambda: sharded.argmax())):
        try:
            call()
        except TypeError as error:
            out["refused"].append((what, str(error)))
    return out


@pytest.mark.timeout(60)
def test_a_replicated_dtensor_gives_its_numbers_and_a_sharded_one_says_which_array():
    for result in minidist.launch(_whole_numbers_worker, world_size=2, transport="pipe",
                                  timeout=40):
        assert result["numpy"] == result["tolist"] == [[0.0, 1.0], [2.0, 3.0]]
        assert result["argmax"] == 3
        assert [what for what, _ in result["refused"]] == ["item()", "numpy()", ">", "<=",
                                                          "argmax()"]
        for what, message in result["refused"]:
            assert message.startswith(f"{what} of a DTensor ((S(0)))"), message
            assert "full_tensor()" in message and "to_local()" in message, message
