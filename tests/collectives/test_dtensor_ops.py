"""The ops' placement rules (minidist.distributed.tensor.ops) against one
process: each case runs the op on DTensors and on the whole Tensors, in
float64, then checks the result's placements, its whole value
(``full_tensor()``) and every input's gradient (the local piece of the whole
gradient, a Partial's gradient being the whole) for a loss ``sum(y * G)``.
Uneven shards (5 and 7 on 2 and 4 ranks) are among the shapes. The
refusals' words are checked too. One launch per world size and transport.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist

RTOL = 1e-12


def _cases():
    import minidist.distributed as dist
    from minidist import Tensor
    from minidist.distributed.tensor import (
        Partial,
        Replicate,
        Shard,
        distribute_tensor,
        init_device_mesh,
    )
    from minidist.nn import functional as F
    from minidist.parallel import loss_parallel

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    rng = np.random.default_rng(1)
    R, S = Replicate(), Shard

    def run(name, dt_fn, plain_fn, *inputs, mesh=mesh, partial_input=False):
        plains, dts = [], []
        for array, placements in inputs:
            plains.append(Tensor(array.copy(), requires_grad=array.dtype.kind == "f"))
            src = Tensor(array.copy(), requires_grad=array.dtype.kind == "f")
            dts.append(distribute_tensor(src, mesh, placements))
        y = plain_fn(*plains)
        y_dt = dt_fn(*dts)
        g = np.random.default_rng(2).standard_normal(y.data.shape)
        (y * Tensor(g)).sum().backward()
        (y_dt.full_tensor() * Tensor(g)).sum().backward()
        value = float(np.abs(y_dt.full_tensor().data - y.data).max()) if y.data.size else 0.0
        grads = 0.0
        for p, d in zip(plains, dts):
            if p.grad is None:
                continue
            shape, offset = d._spec.local_shape_and_offset()
            whole = p.grad
            if not any(isinstance(q, Partial) for q in d.placements):
                whole = whole[tuple(slice(o, o + s) for o, s in zip(offset, shape))]
            grads = max(grads, float(np.abs(d.grad - whole).max()) if whole.size else 0.0)
        out[name] = (str(tuple(str(q) for q in y_dt.placements)), value, grads)

    out = {}
    A = rng.standard_normal((5, 7))
    B = rng.standard_normal((5, 7))
    row = rng.standard_normal(7)
    col = rng.standard_normal((5, 1))
    W = rng.standard_normal((7, 3))
    X3 = rng.standard_normal((2, 5, 7))
    # elementwise
    run("S0+S0", lambda a, b: a + b, lambda a, b: a + b, (A, [S(0)]), (B, [S(0)]))
    run("S1*R", lambda a, b: a * b, lambda a, b: a * b, (A, [S(1)]), (B, [R]))
    run("S1*Rrow", lambda a, b: a * b, lambda a, b: a * b, (A, [S(1)]), (row, [R]))
    run("S0/Rcol", lambda a, b: a / b, lambda a, b: a / b, (A, [S(0)]), (col + 3, [R]))
    run("Rrow-S0", lambda b, a: b - a, lambda b, a: b - a, (row, [R]), (A, [S(0)]))
    run("R+R", lambda a, b: a + b, lambda a, b: a + b, (A, [R]), (B, [R]))
    run("2-S1", lambda a: 2.0 - a * 3.0, lambda a: 2.0 - a * 3.0, (A, [S(1)]))
    # unary
    for op in ("tanh", "exp", "relu", "sigmoid"):
        run(op, lambda a, op=op: getattr(a, op)(), lambda a, op=op: getattr(a, op)(), (A, [S(0)]))
    run("gelu", F.gelu, F.gelu, (A, [S(1)]))
    run("neg_pow", lambda a: (-a) ** 2, lambda a: (-a) ** 2, (A, [S(1)]))
    # matmul
    run("S0@R", lambda a, w: a @ w, lambda a, w: a @ w, (A, [S(0)]), (W, [R]))
    run("R@S1", lambda a, w: a @ w, lambda a, w: a @ w, (A, [R]), (W, [S(1)]))
    run("S1@S0", lambda a, w: a @ w, lambda a, w: a @ w, (A, [S(1)]), (W, [S(0)]))
    run("3d S1@R", lambda a, w: a @ w, lambda a, w: a @ w, (X3, [S(1)]), (W, [R]))
    # Partial results, then P rules
    run("P*R", lambda a, w, b: (a @ w) * b, lambda a, w, b: (a @ w) * b,
        (A, [S(1)]), (W, [S(0)]), (rng.standard_normal((5, 3)), [R]))
    run("P+P", lambda a, w: a @ w - (a @ w) * 0.5, lambda a, w: a @ w - (a @ w) * 0.5,
        (A, [S(1)]), (W, [S(0)]))
    run("P/R", lambda a, w, b: (a @ w) / b, lambda a, w, b: (a @ w) / b,
        (A, [S(1)]), (W, [S(0)]), (rng.standard_normal(3) + 4, [R]))
    # linear: colwise, rowwise (bias once in the sum), batch rows
    Wl, bl = rng.standard_normal((7, 7)), rng.standard_normal(7)
    run("col", F.linear, F.linear, (X3, [R]), (Wl, [S(0)]), (bl, [S(0)]))
    run("row", F.linear, F.linear, (X3, [S(2)]), (Wl, [S(1)]), (bl, [R]))
    run("batch", F.linear, F.linear, (X3, [S(1)]), (Wl, [R]), (bl, [R]))
    # reductions and shapes
    run("sum S0 axis0", lambda a: a.sum(axis=0), lambda a: a.sum(axis=0), (A, [S(0)]))
    run("sum S0 axis1", lambda a: a.sum(axis=1), lambda a: a.sum(axis=1), (A, [S(0)]))
    run("mean S1", lambda a: a.mean(axis=1), lambda a: a.mean(axis=1), (A, [S(1)]))
    run("mean all", lambda a: a.mean(), lambda a: a.mean(), (X3, [S(1)]))
    run("T", lambda a: a.T, lambda a: a.T, (A, [S(0)]))
    run("transpose", lambda a: a.transpose(0, 2, 1), lambda a: a.transpose(0, 2, 1), (X3, [S(2)]))
    run("reshape", lambda a: a.reshape(10, 7), lambda a: a.reshape(10, 7), (X3, [S(2)]))
    run("view", lambda a: a.view(2, 5, 7, 1), lambda a: a.view(2, 5, 7, 1), (X3, [S(1)]))
    # nn.functional
    gamma, beta = rng.standard_normal(7), rng.standard_normal(7)
    run("layer_norm", lambda x, g, b: F.layer_norm(x, 7, g, b),
        lambda x, g, b: F.layer_norm(x, 7, g, b), (X3, [S(1)]), (gamma, [R]), (beta, [R]))
    run("softmax", lambda a: a.softmax(axis=1), lambda a: a.softmax(axis=1), (A, [S(0)]))
    run("log_softmax", lambda a: a.log_softmax(axis=0), lambda a: a.log_softmax(axis=0),
        (A, [S(1)]))
    ids = np.array([[0, 4, 6], [6, 1, 1]])
    table = rng.standard_normal((7, 5))
    run("emb R", lambda t: F.embedding(ids, t), lambda t: F.embedding(ids, t), (table, [R]))
    run("emb S1", lambda t: F.embedding(ids, t), lambda t: F.embedding(ids, t), (table, [S(1)]))
    run("emb S0", lambda t: F.embedding(ids, t), lambda t: F.embedding(ids, t), (table, [S(0)]))
    run("emb idx S0", lambda i, t: F.embedding(i, t), lambda i, t: F.embedding(i, t),
        (np.array([[0, 1], [2, 3], [4, 5], [6, 0], [1, 1]]), [S(0)]), (table, [R]))
    labels = np.array([0, 6, 3, 6, 2])

    def lp(z):
        with loss_parallel():
            return F.cross_entropy(z, labels)
    run("loss_parallel", lp, lambda z: F.cross_entropy(z, labels), (A, [S(1)]))
    ignored = np.array([0, -100, 3, 6, -100])

    def lp_ignore(z):
        with loss_parallel():
            return F.cross_entropy(z, ignored, reduction="sum")
    run("loss_parallel ignore", lp_ignore,
        lambda z: F.cross_entropy(z, ignored, reduction="sum"), (A, [S(1)]))
    run("ce R", lambda z: F.cross_entropy(z, labels), lambda z: F.cross_entropy(z, labels),
        (A, [R]))

    # a 2x2 mesh: both dims at once
    if world == 4:
        mesh2 = init_device_mesh("cpu", (2, 2))
        run("2d col", F.linear, F.linear, (X3, [S(0), R]), (Wl, [R, S(0)]), (bl, [R, S(0)]),
            mesh=mesh2)
        run("2d row", F.linear, F.linear, (X3, [R, S(2)]), (Wl, [R, S(1)]), (bl, [R, R]),
            mesh=mesh2)
        run("2d add", lambda a, b: a + b, lambda a, b: a + b, (A, [S(0), S(1)]),
            (B, [R, R]), mesh=mesh2)

    # refusals: each says what it takes and what to call
    def refused(attempt):
        try:
            attempt()
        except (TypeError, ValueError) as error:
            return str(error)
        return None

    def dt(array, placements):
        return distribute_tensor(Tensor(array), mesh, placements)

    partial = dt(A, [S(1)]) @ dt(W, [S(0)])
    errors = dict(
        p_plus_r=refused(lambda: partial + dt(rng.standard_normal((5, 3)), [R])),
        p_plus_c=refused(lambda: partial + 1.0),
        p_tanh=refused(lambda: partial.tanh()),
        p_times_p=refused(lambda: partial * partial),
        s0_s1=refused(lambda: dt(A, [S(0)]) + dt(B, [S(1)])),
        mm_s0_s0=refused(lambda: dt(A, [S(0)]) @ dt(W, [S(0)])),
        plain=refused(lambda: dt(A, [S(0)]) + Tensor(B)),
        reshape=refused(lambda: dt(A, [S(1)]).reshape(35)),
        softmax=refused(lambda: dt(A, [S(1)]).softmax(axis=1)),
        layer_norm=refused(lambda: F.layer_norm(dt(X3, [S(2)]), 7)),
        ce_outside=refused(lambda: F.cross_entropy(dt(A, [S(1)]), labels)),
        dropout=refused(lambda: F.dropout(dt(A, [S(0)]), 0.5)),
        unruled=refused(lambda: dt(A, [S(0)]).max()),
    )
    eval_dropout = F.dropout(dt(A, [S(0)]), 0.5, training=False).placements == (S(0),)
    return dict(out=out, errors=errors, eval_dropout=eval_dropout)


EXPECTED = {
    "S0+S0": "('S(0)',)", "S1*R": "('S(1)',)", "S1*Rrow": "('S(1)',)", "S0/Rcol": "('S(0)',)",
    "Rrow-S0": "('S(0)',)", "R+R": "('R',)", "2-S1": "('S(1)',)", "tanh": "('S(0)',)",
    "exp": "('S(0)',)", "relu": "('S(0)',)", "sigmoid": "('S(0)',)", "gelu": "('S(1)',)",
    "neg_pow": "('S(1)',)", "S0@R": "('S(0)',)", "R@S1": "('S(1)',)", "S1@S0": "('P(sum)',)",
    "3d S1@R": "('S(1)',)", "P*R": "('P(sum)',)", "P+P": "('P(sum)',)", "P/R": "('P(sum)',)",
    "col": "('S(2)',)", "row": "('P(sum)',)", "batch": "('S(1)',)",
    "sum S0 axis0": "('P(sum)',)", "sum S0 axis1": "('S(0)',)", "mean S1": "('P(sum)',)",
    "mean all": "('P(sum)',)", "T": "('S(1)',)", "transpose": "('S(1)',)",
    "reshape": "('S(1)',)", "view": "('S(1)',)", "layer_norm": "('S(1)',)",
    "softmax": "('S(0)',)", "log_softmax": "('S(1)',)", "emb R": "('R',)",
    "emb S1": "('S(2)',)", "emb S0": "('P(sum)',)", "emb idx S0": "('S(0)',)",
    "loss_parallel": "('R',)", "loss_parallel ignore": "('R',)", "ce R": "('R',)",
}
EXPECTED_2D = {"2d col": "('S(0)', 'S(2)')", "2d row": "('R', 'P(sum)')",
               "2d add": "('S(0)', 'S(1)')"}

RUNS = [(2, "pipe"), (2, "shm"), (4, "shm")]


@pytest.fixture(scope="module")
def runs():
    return {key: minidist.launch(_cases, world_size=key[0], transport=key[1], timeout=240)
            for key in RUNS}


@pytest.mark.blas_kernel
@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", RUNS)
def test_every_rule_gives_the_placements_values_and_gradients_of_one_process(runs, key):
    for rank, result in enumerate(runs[key]):
        out = result["out"]
        expected = dict(EXPECTED, **(EXPECTED_2D if key[0] == 4 else {}))
        assert set(out) == set(expected)
        for name, (placements, value, grads) in out.items():
            assert placements == expected[name], (rank, name)
            assert value < RTOL * 100, (rank, name, value)
            assert grads < RTOL * 100, (rank, name, grads)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", RUNS)
def test_refusals_say_which_layouts_the_op_takes_and_what_to_call(runs, key):
    errors = runs[key][0]["errors"]
    assert "count" in errors["p_plus_r"] and "Replicate()" in errors["p_plus_r"]
    assert "once per rank" in errors["p_plus_c"]
    assert "not linear" in errors["p_tanh"]
    assert "product of two Partials" in errors["p_times_p"]
    assert "different dims" in errors["s0_s1"]
    assert "(S(last of a), S(second-to-last of b))" in errors["mm_s0_s0"]
    assert "make it a DTensor first" in errors["plain"]
    assert "keep dim 1" in errors["reshape"]
    assert "loss_parallel()" in errors["softmax"]
    assert "normalized dims" in errors["layer_norm"]
    assert "with loss_parallel():" in errors["ce_outside"]
    assert "mask" in errors["dropout"]
    assert "no placement rule" in errors["unruled"]
    assert runs[key][0]["eval_dropout"]


def _minidist_peer():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from dtensor_torch_peer import cases, short

    from minidist import Tensor
    from minidist.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
    from minidist.nn import functional as F

    mesh = init_device_mesh("cpu", (2,))

    def make(array, placements):
        return distribute_tensor(Tensor(array), mesh, placements)

    return {name: (short(y.placements), tuple(y.to_local().data.shape), y.to_local().data.copy())
            for name, y in cases(np, make, F, Replicate, Shard, mesh)}


@pytest.mark.blas_kernel
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_rules_agree_with_live_torch_dtensor_on_gloo():
    pytest.importorskip("torch")
    import sys
    from pathlib import Path

    from minidist.bench.common import spawn_torch_ranks

    sys.path.insert(0, str(Path(__file__).parent))
    from dtensor_torch_peer import torch_rank

    theirs = spawn_torch_ranks(torch_rank, 2, timeout=300)
    ours = minidist.launch(_minidist_peer, world_size=2, transport="pipe", timeout=120)
    for name, (placements, _, _) in theirs[0].items():
        for rank in range(2):
            mine = ours[rank][name]
            assert mine[0] == theirs[rank][name][0], (rank, name, mine[0], placements)
            assert mine[1] == theirs[rank][name][1], (rank, name)
            if "P(sum)" not in placements:   # a Partial's terms may differ, their sum not
                np.testing.assert_allclose(mine[2], theirs[rank][name][2], rtol=1e-12,
                                           atol=1e-12)
        if "P(sum)" in placements:
            np.testing.assert_allclose(ours[0][name][2] + ours[1][name][2],
                                       theirs[0][name][2] + theirs[1][name][2], rtol=1e-12,
                                       atol=1e-12)
