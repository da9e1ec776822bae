"""Gradient clipping and accumulation on every strategy must give one process's
numbers: the total norm of the whole gradients, and the weights after the
clipped step (float64, rtol 1e-12 on norms, 1e-10 on weights after steps).

One launch per world size and transport runs every case inside the workers;
the parent computes each reference in this process on the whole model and
the whole batch. SGD without momentum, so that a clipped gradient moves the
weights by exactly its own length (Adam would hide the scale); ``max_norm``
below every total, so that every step clips (the references assert it).

* DTensor parameters (2 ranks: Shard(0) uneven, Shard(1), Replicate, a
  Partial refused; 4 ranks: a 2-D mesh with (Shard, Shard), (Replicate,
  Shard), (Shard, Replicate) and a 1-D sub-mesh's Shard mixed in): the plain
  ``minidist.nn.utils.clip_grad_norm_`` for p = 2, 1, inf and 3;
* DDP and ZeRO-1 (replicated gradients: the plain one), with ``no_sync``
  accumulation over 2 micro-batches; every ZeRO stage built by
  ``zero_stages.wrap`` and clipped by ``zero_stages.clip_grad_norm_``;
* FSDP1 / ZeRO-2 and 3 (SHARD_GRAD_OP, FULL_SHARD, NO_SHARD):
  ``fsdp.clip_grad_norm_``, accumulation with and without ``no_sync``; and
  the wrong-by-design case: the plain function on FULL_SHARD's local shards
  gives each rank another norm, none of them one process's;
* tensor parallelism with the split layers (an MLP of a column and a row
  layer, accumulated over 2 micro-batches; the TensorParallelGPT): the plain
  function, the split layers' flags saying what is sharded;
* the Pipeline (``step(max_norm=)``, the stages summed over the pipeline
  group), and torch's pipelining names followed by torchtitan's
  ``clip_grad_norm_(..., pp_mesh=mesh["pp"])`` and the optimizer's step;
* GPT3D on pp2 (the tied weight on two stages, counted once; also
  interleaved, 2 stages a rank), tp2 (also with sequence parallelism), dp2; on
  4 ranks pp2 x tp2, dp2 x tp2, pp2 x dp2; on 8 ranks dp2 x tp2 x pp2.

Accumulation in a pipeline is its micro-batches: that a Pipeline over m
micro-batches equals one process on the whole batch is
tests/parallel/test_pipeline.py's subject, and GPT3D's (2 micro-batches)
tests/parallel/test_gpt_3d.py's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import nn, optim
from minidist.distributed import init_device_mesh
from minidist.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from minidist.models.gpt import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.nn.utils import clip_grad_norm_
from minidist.tensor import Tensor

NORM_RTOL, WEIGHT_RTOL, ATOL = 1e-12, 1e-10, 1e-13
MAX_NORM, LR = 0.05, 0.1
NORMS = [2.0, 1.0, math.inf, 3.0]
CONFIG = GPTConfig(vocab_size=11, block_size=4, n_layer=2, n_head=2, n_embd=8)

# ----------------------------------------------------------------- shared pieces


def _mlp(seed=0):
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 7), nn.Tanh(),
                         nn.Linear(7, 3)).to(np.float64)


def _data(step, batch=8):
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((batch, 6)), rng.integers(0, 3, batch)


def _gpt():
    return GPT(CONFIG, rng=0).to(np.float64)


def _tokens(step, batch=4):
    rng = np.random.default_rng(20 + step)
    return (rng.integers(0, CONFIG.vocab_size, (batch, 4)),
            rng.integers(0, CONFIG.vocab_size, (batch, 4)))


def _mine(batch, rank, world):
    return np.array_split(batch, world)[rank]


def _weights(params):
    return [p.data.copy() for p in params]


# ----------------------------------------------------------------- DTensors

#: (shape, placements per mesh dim) on the 1-D mesh of 2 ranks.
DTENSORS_1D = [((5, 3), [Shard(0)]), ((4, 6), [Shard(1)]), ((7,), [Replicate()])]
#: on the (2, 2) mesh ("dp", "tp"); None: a 1-D mesh of the tp dim alone.
DTENSORS_2D = [((6, 4), [Shard(0), Shard(0)]), ((3, 8), [Replicate(), Shard(1)]),
               ((5, 2), [Shard(0), Replicate()]), ((3,), [Replicate(), Replicate()]),
               ((9, 2), None)]


def _whole_grads(specs, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape, _ in specs]


def _dtensor_params(specs, mesh, seed):
    """DTensorParameters of zeros whose gradients are this rank's pieces of
    known whole gradients."""
    params = []
    for (shape, placements), grad in zip(specs, _whole_grads(specs, seed)):
        on = mesh if placements is not None else mesh["tp"]
        placements = placements if placements is not None else [Shard(0)]
        param = nn.Parameter(distribute_tensor(Tensor(np.zeros(shape)), on, placements))
        box_shape, offset = param._spec.local_shape_and_offset()
        param.grad = grad[tuple(slice(o, o + s) for o, s in zip(offset, box_shape))].copy()
        params.append((param, offset, box_shape))
    return params


def _dtensor_cases(specs, mesh):
    from minidist.distributed.tensor import DTensor
    from minidist.nn.utils import get_total_norm

    out = {}
    for p in NORMS:
        params = _dtensor_params(specs, mesh, seed=3)
        # torch 2.6's first half on the gradients as DTensors of their layout.
        grads = [DTensor.from_local(Tensor(q.grad), q.device_mesh, q.placements, shape=q.shape)
                 for q, _, _ in params]
        out["get_total_norm", p] = float(get_total_norm(grads, p).data)
        total = clip_grad_norm_([q for q, _, _ in params], MAX_NORM, p)
        out[p] = (float(total.data), [(q.grad.copy(), o, s) for q, o, s in params])
    return out


def _dtensor_refusal(mesh):
    param = nn.Parameter(distribute_tensor(Tensor(np.ones(4)), mesh, [Partial()]))
    param.grad = np.ones(4)
    try:
        clip_grad_norm_([param], 1.0)
    except ValueError as error:
        return str(error)
    return None


def _check_dtensors(results, specs, key):
    for p in NORMS:
        whole = [nn.Parameter(np.zeros(shape)) for shape, _ in specs]
        for w, g in zip(whole, _whole_grads(specs, seed=3)):
            w.grad = g
        expected = clip_grad_norm_(whole, MAX_NORM, p)
        assert float(expected.data) > MAX_NORM
        for result in results:
            total, pieces = result[key][p]
            assert total == pytest.approx(float(expected.data), rel=NORM_RTOL), (p, total)
            assert result[key]["get_total_norm", p] == pytest.approx(total, rel=NORM_RTOL)
            for w, (grad, offset, shape) in zip(whole, pieces):
                box = tuple(slice(o, o + s) for o, s in zip(offset, shape))
                np.testing.assert_allclose(grad, w.grad[box], rtol=NORM_RTOL, atol=ATOL)


# ----------------------------------------------------------------- data parallel


def _ddp_case(zero: bool, microbatches: int):
    from minidist.parallel import DistributedDataParallel, ZeroRedundancyOptimizer

    rank, world = dist.get_rank(), dist.get_world_size()
    model = _mlp()
    ddp = DistributedDataParallel(model)
    optimizer = (ZeroRedundancyOptimizer(ddp.parameters(), optim.SGD, lr=LR) if zero
                 else optim.SGD(ddp.parameters(), lr=LR))
    norms = []
    for step in range(2):
        x, y = (_mine(a, rank, world) for a in _data(step))
        optimizer.zero_grad(set_to_none=False)
        pieces = list(zip(np.array_split(x, microbatches), np.array_split(y, microbatches)))
        for index, (xm, ym) in enumerate(pieces):
            loss = F.cross_entropy(ddp(Tensor(xm)), ym) * (1.0 / microbatches)
            if index < len(pieces) - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
        norms.append(float(clip_grad_norm_(ddp.parameters(), MAX_NORM).data))
        optimizer.step()
    return norms, _weights(model.parameters())


def _fsdp_case(strategy, microbatches: int, use_no_sync: bool):
    from minidist.parallel import FullyShardedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp = FullyShardedDataParallel(_mlp(), sharding_strategy=strategy)
    optimizer = optim.SGD(fsdp.parameters(), lr=LR)
    norms, local_norms = [], []
    for step in range(2):
        x, y = (_mine(a, rank, world) for a in _data(step))
        optimizer.zero_grad()
        pieces = list(zip(np.array_split(x, microbatches), np.array_split(y, microbatches)))
        for index, (xm, ym) in enumerate(pieces):
            loss = F.cross_entropy(fsdp(Tensor(xm)), ym) * (1.0 / microbatches)
            if use_no_sync and index < len(pieces) - 1:
                with fsdp.no_sync():
                    loss.backward()
                # Nothing reduced into the shards yet: the gradients wait, whole.
                assert all(shard.grad is None for shard in fsdp.shards)
                assert all(p.grad is not None for p in fsdp.module.parameters())
            else:
                loss.backward()
        # Wrong by design: the one-process function sees this rank's shards only.
        local_norms.append(float(clip_grad_norm_(fsdp.parameters(), 1e30).data))
        norms.append(float(fsdp.clip_grad_norm_(MAX_NORM).data))
        optimizer.step()
    return norms, fsdp.full_weights(), local_norms


def _stage_case(stage: int):
    """zero_stages.wrap and its clip_grad_norm_, the same loop for every stage."""
    from minidist.parallel.data import zero_stages

    rank, world = dist.get_rank(), dist.get_world_size()
    model = _mlp()
    wrapped, optimizer = zero_stages.wrap(model, stage, optim.SGD, lr=LR)
    norms = []
    for step in range(2):
        x, y = (_mine(a, rank, world) for a in _data(step))
        optimizer.zero_grad(set_to_none=False)
        F.cross_entropy(wrapped(Tensor(x)), y).backward()
        norms.append(float(zero_stages.clip_grad_norm_(wrapped, MAX_NORM).data))
        optimizer.step()
    weights = wrapped.full_weights() if stage >= 2 else _weights(model.parameters())
    return norms, weights


def _reference_mlp():
    """One process, the whole batch of each step: the norms and final weights."""
    model = _mlp()
    optimizer = optim.SGD(model.parameters(), lr=LR)
    norms = []
    for step in range(2):
        x, y = _data(step)
        optimizer.zero_grad()
        F.cross_entropy(model(Tensor(x)), y).backward()
        norms.append(float(clip_grad_norm_(model.parameters(), MAX_NORM).data))
        optimizer.step()
    assert min(norms) > MAX_NORM
    return norms, _weights(model.parameters())


def _check_norms_and_weights(norms, weights, reference, case):
    ref_norms, ref_weights = reference
    np.testing.assert_allclose(norms, ref_norms, rtol=NORM_RTOL, err_msg=case)
    for got, want in zip(weights, ref_weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=WEIGHT_RTOL, atol=ATOL, err_msg=case)


# ----------------------------------------------------------------- tensor parallel


def _whole_mlp_layers():
    nn.init.manual_seed(1)
    return nn.Linear(6, 8).to(np.float64), nn.Linear(8, 4).to(np.float64)


def _tp_case(microbatches: int):
    from minidist.parallel.tensor import ColumnParallelLinear, RowParallelLinear

    first, second = _whole_mlp_layers()
    column = ColumnParallelLinear.from_linear(first)
    row = RowParallelLinear.from_linear(second, input_is_parallel=True)
    params = [column.weight, column.bias, row.weight, row.bias]
    flags = [getattr(p, "tensor_model_parallel", False) for p in params]
    optimizer = optim.SGD(params, lr=LR)
    norms = []
    for step in range(2):
        x, _ = _data(step)
        target = np.tanh(x[:, :4])
        optimizer.zero_grad()
        for xm, tm in zip(np.array_split(x, microbatches), np.array_split(target, microbatches)):
            out = row(column(Tensor(xm)).tanh())
            (F.mse_loss(out, Tensor(tm)) * (1.0 / microbatches)).backward()
        norms.append(float(clip_grad_norm_(params, MAX_NORM).data))
        optimizer.step()
    return norms, _weights(params), column.shard, row.shard, flags


def _reference_tp():
    first, second = _whole_mlp_layers()
    params = [first.weight, first.bias, second.weight, second.bias]
    optimizer = optim.SGD(params, lr=LR)
    norms = []
    for step in range(2):
        x, _ = _data(step)
        optimizer.zero_grad()
        F.mse_loss(second(first(Tensor(x)).tanh()), Tensor(np.tanh(x[:, :4]))).backward()
        norms.append(float(clip_grad_norm_(params, MAX_NORM).data))
        optimizer.step()
    assert min(norms) > MAX_NORM
    return norms, _weights(params)


def _tp_gpt_case():
    from minidist.parallel.tensor import TensorParallelGPT

    tp = TensorParallelGPT(_gpt())
    optimizer = optim.SGD(tp.parameters(), lr=LR)
    norms = []
    for step in range(2):
        idx, targets = _tokens(step)
        optimizer.zero_grad()
        tp.loss(tp(idx), targets).backward()
        norms.append(float(clip_grad_norm_(tp.parameters(), MAX_NORM).data))
        optimizer.step()
    return norms, {name: p.data.copy() for name, p in tp.named_parameters()}


def _reference_gpt():
    model = _gpt()
    optimizer = optim.SGD(model.parameters(), lr=LR)
    norms = []
    for step in range(2):
        idx, targets = _tokens(step)
        optimizer.zero_grad()
        F.cross_entropy(model(idx).reshape(-1, CONFIG.vocab_size), targets.reshape(-1)).backward()
        norms.append(float(clip_grad_norm_(model.parameters(), MAX_NORM).data))
        optimizer.step()
    assert min(norms) > MAX_NORM
    weights = {name: p.data for name, p in model.named_parameters()}
    weights["lm_head.weight"] = model.lm_head.weight.data
    return norms, weights


def _check_gpt_shards(shards, weights, tp_rank, tp, case):
    from minidist.parallel.tensor.gpt import shard_index

    for name, shard in shards.items():
        full = weights[name]
        expected = full[shard_index(name, full.shape, tp_rank, tp, CONFIG)]
        np.testing.assert_allclose(shard, expected, rtol=WEIGHT_RTOL, atol=ATOL,
                                   err_msg=f"{case}: {name}")


# ----------------------------------------------------------------- pipeline and 3D


def _pipeline_case():
    from minidist.parallel import Pipeline

    model = _mlp()
    index = {id(p): i for i, p in enumerate(model.parameters())}
    pipe = Pipeline(model, "1f1b", microbatches=2)
    optimizer = optim.SGD(pipe.parameters(), lr=LR)
    norms = []
    for step in range(2):
        x, y = _data(step)
        pipe.step(x, y, nn.CrossEntropyLoss(), optimizer, max_norm=MAX_NORM)
        norms.append(float(pipe.total_norm.data))
    return norms, {index[id(p)]: p.data.copy() for p in pipe.parameters()}


def _pipelining_case():
    """torch's pipelining names, then torchtitan's clip_grad_norm_ with the
    pipeline's mesh as pp_mesh, then the optimizer: a torchtitan loop."""
    from minidist.parallel import PipelineStage, Schedule1F1B
    from minidist.parallel import clip_grad_norm_ as titan_clip
    from minidist.parallel.pipeline import split_model

    rank, world = dist.get_rank(), dist.get_world_size()
    pp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("pp",))
    model = _mlp()
    index = {id(p): i for i, p in enumerate(model.parameters())}
    piece = split_model(model, world)[rank]
    stage = PipelineStage(piece, stage_index=rank, num_stages=world, device=None)
    schedule = Schedule1F1B(stage, n_microbatches=2, loss_fn=nn.CrossEntropyLoss())
    optimizer = optim.SGD(piece.parameters(), lr=LR)
    norms = []
    for step in range(2):
        x, y = _data(step)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        norms.append(float(titan_clip(piece.parameters(), MAX_NORM, pp_mesh=pp_mesh["pp"]).data))
        optimizer.step()
    return norms, {index[id(p)]: p.data.copy() for p in piece.parameters()}


def _gpt3d_case(shape, schedule="1f1b", virtual=1, sequence_parallel=False):
    from minidist.parallel.mesh.gpt_3d import GPT3D

    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("pp", "dp", "tp"))
    gpt = GPT3D(_gpt(), mesh, schedule, microbatches=2, virtual_stages=virtual,
                sequence_parallel=sequence_parallel)
    optimizer = optim.SGD(gpt.parameters(), lr=LR)
    norms = []
    for step in range(2):
        gpt.step(*_tokens(step), optimizer, max_norm=MAX_NORM)
        norms.append(float(gpt.pipeline.total_norm.data))
    return norms, {name: p.data.copy() for name, p in gpt.named_parameters().items()}, \
        mesh.get_local_rank("tp")


GPT3D_SHAPES = {2: {"pp2": (2, 1, 1), "tp2": (1, 1, 2), "dp2": (1, 2, 1),
                    "tp2 +sp": (1, 1, 2), "pp2 interleaved": (2, 1, 1)},
                4: {"pp2 x tp2": (2, 1, 2), "dp2 x tp2": (1, 2, 2), "pp2 x dp2": (2, 2, 1)},
                8: {"pp2 x dp2 x tp2": (2, 2, 2)}}

#: schedule, virtual stages, sequence parallelism, where not 1F1B on one stage a rank.
GPT3D_OPTIONS = {"tp2 +sp": ("1f1b", 1, True), "pp2 interleaved": ("interleaved_1f1b", 2, False)}


def _check_gpt3d(results, reference, world):
    ref_norms, weights = reference
    for case, (_, _, tp) in GPT3D_SHAPES[world].items():
        seen = set()
        for result in results:
            norms, shards, tp_rank = result["gpt3d"][case]
            np.testing.assert_allclose(norms, ref_norms, rtol=NORM_RTOL, err_msg=case)
            _check_gpt_shards(shards, weights, tp_rank, tp, case)
            seen |= set(shards)
        assert seen | {"lm_head.weight"} == set(weights), case


# ----------------------------------------------------------------- the workers


def _worker_2():
    mesh = init_device_mesh("cpu", (2,))
    out = {"dtensor": _dtensor_cases(DTENSORS_1D, mesh), "partial": _dtensor_refusal(mesh)}
    out["ddp"] = _ddp_case(zero=False, microbatches=1)
    out["ddp no_sync"] = _ddp_case(zero=False, microbatches=2)
    out["zero1"] = _ddp_case(zero=True, microbatches=1)
    out["zero1 no_sync"] = _ddp_case(zero=True, microbatches=2)
    for strategy in ("SHARD_GRAD_OP", "FULL_SHARD", "NO_SHARD"):
        out[strategy] = _fsdp_case(strategy, 1, False)
        out[strategy + " no_sync"] = _fsdp_case(strategy, 2, True)
        out[strategy + " accumulated"] = _fsdp_case(strategy, 2, False)
    for stage in range(4):
        out[f"stage {stage}"] = _stage_case(stage)
    out["tp"] = _tp_case(1)
    out["tp accumulated"] = _tp_case(2)
    out["tp gpt"] = _tp_gpt_case()
    out["pipeline"] = _pipeline_case()
    out["pipelining"] = _pipelining_case()
    out["gpt3d"] = {case: _gpt3d_case(shape, *GPT3D_OPTIONS.get(case, ()))
                    for case, shape in GPT3D_SHAPES[2].items()}
    return out


def _worker_4():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out = {"dtensor 2d": _dtensor_cases(DTENSORS_2D, mesh)}
    out["FULL_SHARD"] = _fsdp_case("FULL_SHARD", 1, False)
    out["FULL_SHARD no_sync"] = _fsdp_case("FULL_SHARD", 2, True)
    out["gpt3d"] = {case: _gpt3d_case(shape) for case, shape in GPT3D_SHAPES[4].items()}
    return out


def _worker_8():
    return {"gpt3d": {case: _gpt3d_case(shape) for case, shape in GPT3D_SHAPES[8].items()}}


@pytest.fixture(scope="module")
def references():
    return {"mlp": _reference_mlp(), "tp": _reference_tp(), "gpt": _reference_gpt()}


def _check_data_parallel(results, reference, cases):
    for case in cases:
        for result in results:
            norms, weights = result[case][:2]
            _check_norms_and_weights(norms, weights, reference, case)


def _check_wrong_by_design(results, reference):
    """The one-process function on FULL_SHARD's shards: each rank a norm of
    its own slice, smaller than the whole's and not one process's."""
    ref_norms = reference[0]
    local = [result["FULL_SHARD"][2][0] for result in results]
    assert all(n < ref_norms[0] * (1 - 1e-3) for n in local), (local, ref_norms[0])
    assert len(set(local)) == len(local), local
    # The squares of the ranks' local norms add up to the whole's square.
    assert sum(n * n for n in local) == pytest.approx(ref_norms[0] ** 2, rel=1e-12)


@pytest.mark.blas_kernel
@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", ["pipe", "shm"])
def test_every_strategy_clips_as_one_process_on_2_ranks(transport, references):
    results = minidist.launch(_worker_2, world_size=2, transport=transport, timeout=540)
    _check_dtensors(results, DTENSORS_1D, "dtensor")
    assert results[0]["partial"].startswith("rank 0: clip_grad_norm_: a gradient laid out")
    assert "redistribute it to Replicate()" in results[0]["partial"]
    _check_data_parallel(results, references["mlp"],
                         ["ddp", "ddp no_sync", "zero1", "zero1 no_sync"]
                         + [f"stage {stage}" for stage in range(4)]
                         + [s + how for s in ("SHARD_GRAD_OP", "FULL_SHARD", "NO_SHARD")
                            for how in ("", " no_sync", " accumulated")])
    _check_wrong_by_design(results, references["mlp"])
    ref_norms, ref_weights = references["tp"]
    for case in ("tp", "tp accumulated"):
        for result in results:
            norms, weights, column_rows, row_columns, flags = result[case]
            assert flags == [True, True, True, False], "the row layer's bias is whole"
            np.testing.assert_allclose(norms, ref_norms, rtol=NORM_RTOL, err_msg=case)
            expected = [ref_weights[0][column_rows], ref_weights[1][column_rows],
                        ref_weights[2][:, row_columns], ref_weights[3]]
            for got, want in zip(weights, expected):
                np.testing.assert_allclose(got, want, rtol=WEIGHT_RTOL, atol=ATOL, err_msg=case)
    ref_norms, gpt_weights = references["gpt"]
    for rank, result in enumerate(results):
        norms, shards = result["tp gpt"]
        np.testing.assert_allclose(norms, ref_norms, rtol=NORM_RTOL)
        _check_gpt_shards(shards, gpt_weights, rank, 2, "tp gpt")
    mlp_norms, mlp_weights = references["mlp"]
    for case in ("pipeline", "pipelining"):
        held = {}
        for result in results:
            norms, weights = result[case]
            np.testing.assert_allclose(norms, mlp_norms, rtol=NORM_RTOL, err_msg=case)
            held.update(weights)
        assert sorted(held) == list(range(len(mlp_weights))), case
        for i, got in held.items():
            np.testing.assert_allclose(got, mlp_weights[i], rtol=WEIGHT_RTOL, atol=ATOL,
                                       err_msg=case)
    _check_gpt3d(results, references["gpt"], 2)


@pytest.mark.blas_kernel
@pytest.mark.timeout(900)
def test_2d_meshes_and_3d_clip_as_one_process_on_4_ranks(references):
    results = minidist.launch(_worker_4, world_size=4, transport="shm", timeout=840)
    _check_dtensors(results, DTENSORS_2D, "dtensor 2d")
    _check_data_parallel(results, references["mlp"], ["FULL_SHARD", "FULL_SHARD no_sync"])
    _check_wrong_by_design(results, references["mlp"])
    _check_gpt3d(results, references["gpt"], 4)


@pytest.mark.blas_kernel
@pytest.mark.timeout(900)
def test_3d_clips_as_one_process_on_8_ranks(references):
    results = minidist.launch(_worker_8, world_size=8, transport="shm", timeout=840)
    _check_gpt3d(results, references["gpt"], 8)
