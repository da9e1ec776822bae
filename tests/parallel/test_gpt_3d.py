"""The GPT trained on a DP x TP x PP device mesh must end with the weights of
one process trained on the same batches (the "3D" of lesson 17).

One launch per world size runs every mesh shape of that size inside the
workers, each from its own ``init_device_mesh("cpu", (pp, dp, tp),
mesh_dim_names=("pp", "dp", "tp"))``: two AdamW steps in float64 on fixed
global batches, each rank returning its shards under the GPT's names. The
parent trains the whole GPT in this process and compares every shard with
its rows or columns of the whole weights (``shard_index``):

* 2 ranks, the 1-D meshes: dp2, tp2 (also with sequence parallelism), pp2
  with 1F1B and with interleaved 1F1B (2 virtual stages per rank);
* 4 ranks, the 2-D meshes: dp2 x tp2, tp2 x pp2 (also with sequence
  parallelism), dp2 x pp2 interleaved; and pp2 x tp2 with the embedding
  group's sum switched off, which must *not* give the weights (the tied
  ``wte`` / ``lm_head`` is on two ranks: each copy alone sees half its
  gradient);
* 8 ranks, the 3-D mesh dp2 x tp2 x pp2 with 1F1B: 8 processes on the
  machine's cores, slow but run by the suite (one launch, two steps of a
  tiny model).

Stage cutting (:func:`stage_blocks`) and the refusals are checked here too,
without processes; ``examples/gpt_3d.py`` runs on a pp2 x tp2 mesh.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minidist
from minidist import optim
from minidist.distributed import init_device_mesh
from minidist.models.gpt import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.parallel.mesh.gpt_3d import GPT3D, stage_blocks
from minidist.parallel.tensor.gpt import shard_index

CONFIG = GPTConfig(vocab_size=11, block_size=4, n_layer=2, n_head=2, n_embd=8)
BATCH, STEPS, TRAIN_STEPS = 4, 4, 2
RTOL, ATOL = 1e-9, 1e-12

#: (name, (pp, dp, tp), schedule, virtual_stages, sequence_parallel, embedding_sum)
CASES = {
    2: [("dp2", (1, 2, 1), "1f1b", 1, False, True),
        ("tp2", (1, 1, 2), "1f1b", 1, False, True),
        ("tp2+sp", (1, 1, 2), "1f1b", 1, True, True),
        ("pp2 1f1b", (2, 1, 1), "1f1b", 1, False, True),
        ("pp2 interleaved", (2, 1, 1), "interleaved_1f1b", 2, False, True)],
    4: [("dp2 x tp2", (1, 2, 2), "1f1b", 1, False, True),
        ("pp2 x tp2", (2, 1, 2), "1f1b", 1, False, True),
        ("pp2 x tp2 +sp", (2, 1, 2), "interleaved_1f1b", 2, True, True),
        ("pp2 x dp2 interleaved", (2, 2, 1), "interleaved_1f1b", 2, False, True),
        ("pp2 x tp2 no embedding sum", (2, 1, 2), "1f1b", 1, False, False)],
    8: [("pp2 x dp2 x tp2", (2, 2, 2), "1f1b", 1, False, True)],
}


def _model():
    return GPT(CONFIG, rng=0).to(np.float64)


def _batch(step):
    rng = np.random.default_rng(20 + step)
    return (rng.integers(0, CONFIG.vocab_size, (BATCH, STEPS)),
            rng.integers(0, CONFIG.vocab_size, (BATCH, STEPS)))


def _train(shape, schedule, virtual, sequence_parallel, embedding_sum):
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("pp", "dp", "tp"))
    gpt = GPT3D(_model(), mesh, schedule, microbatches=2, virtual_stages=virtual,
                sequence_parallel=sequence_parallel)
    if not embedding_sum:
        gpt.embedding_group = None
    optimizer = optim.AdamW(gpt.parameters(), lr=1e-2, weight_decay=0.1)
    losses = [gpt.step(*_batch(step), optimizer) for step in range(TRAIN_STEPS)]
    return dict(params={name: p.data.copy() for name, p in gpt.named_parameters().items()},
                tp_rank=mesh.get_local_rank("tp"), losses=losses)


def _errors():
    """What the mesh-aware Pipeline and GPT3D refuse, each error's text."""
    from minidist import nn
    from minidist.parallel.pipeline.executor import Pipeline

    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("pp", "dp"))
    found = {}
    for case, attempt in {
        "dp group alone": lambda: Pipeline(nn.Sequential(nn.Linear(2, 2)),
                                           data_parallel_group=mesh["dp"]),
        "dp size disagrees": lambda: Pipeline(nn.Sequential(nn.Linear(2, 2)),
                                              pipeline_group=mesh["pp"],
                                              data_parallel_group=mesh["dp"], data_parallel=4),
        "mesh without tp": lambda: GPT3D(_model(), mesh),
    }.items():
        try:
            attempt()
            found[case] = None
        except (ValueError, TypeError) as error:
            found[case] = str(error)
    return found


def _worker(world):
    runs = {name: _train(shape, schedule, virtual, sp, embedding_sum)
            for name, shape, schedule, virtual, sp, embedding_sum in CASES[world]}
    if world == 2:
        runs["errors"] = _errors()
    return runs


def _run(world):
    return minidist.launch(_worker, world_size=world, transport="shm", args=(world,), timeout=600)


@pytest.fixture(scope="module")
def whole():
    """The whole GPT's weights after the same steps in this process (the tied
    matrix under both its names), and each step's loss."""
    model = _model()
    optimizer = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(TRAIN_STEPS):
        idx, targets = _batch(step)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(idx).reshape(-1, CONFIG.vocab_size), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    weights = {name: p.data for name, p in model.named_parameters()}
    weights["lm_head.weight"] = model.lm_head.weight.data
    return weights, losses


def _mismatches(results, case, whole_weights):
    """The (name, rank) of every shard that differs from the whole model's, and
    whether every parameter of the GPT was held by some rank."""
    _, (pp, dp, tp), *_ = next(c for c in CASES[len(results)] if c[0] == case)
    wrong, seen = [], set()
    for rank, result in enumerate(results):
        run = result[case]
        for name, shard in run["params"].items():
            seen.add(name)
            full = whole_weights[name]
            expected = full[shard_index(name, full.shape, run["tp_rank"], tp, CONFIG)]
            if not np.allclose(shard, expected, rtol=RTOL, atol=ATOL):
                wrong.append((name, rank))
    return wrong, seen


def _check(results, whole, world):
    weights, losses = whole
    for case, *_ in CASES[world]:
        wrong, seen = _mismatches(results, case, weights)
        if "no embedding sum" in case:
            assert wrong and {name for name, _ in wrong} >= {"transformer.wte.weight",
                                                            "lm_head.weight"}, case
            continue
        assert not wrong, f"{case}: shards differ from one process's weights: {wrong}"
        _, (pp, _, _), *_ = next(c for c in CASES[world] if c[0] == case)
        if pp == 1:   # one Parameter for both ends, named once (as the GPT's own)
            seen.add("lm_head.weight")
        assert seen == set(weights), f"{case}: parameters held by no rank: {set(weights) - seen}"
        # The last stage's ranks report their replica's mean loss; with equal
        # replicas their mean is the whole batch's loss of the first step.
        first = [r[case]["losses"][0] for r in results if r[case]["losses"][0] is not None]
        assert len(first) == world // pp, case
        assert np.mean(first) == pytest.approx(losses[0], rel=1e-9), case


_RUNS: dict = {}   # world size -> the launch's results, shared by the tests of that size


def _results(world):
    if world not in _RUNS:
        _RUNS[world] = _run(world)
    return _RUNS[world]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 4])
def test_1d_and_2d_meshes_train_to_the_weights_of_one_process(world, whole):
    _check(_results(world), whole, world)


@pytest.mark.timeout(600)
def test_errors_say_what_and_what_to_do(whole):
    for found in (r["errors"] for r in _results(2)):
        assert "needs its pipeline_group too" in found["dp group alone"]
        assert "leave data_parallel out" in found["dp size disagrees"]
        assert "named 'pp', 'dp' and 'tp'" in found["mesh without tp"]


@pytest.mark.timeout(900)
def test_3d_mesh_of_8_ranks_trains_to_the_weights_of_one_process(whole):
    _check(_run(8), whole, 8)


def test_stages_take_the_blocks_in_order_balanced():
    assert stage_blocks(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_blocks(2, 4) == [range(0, 0), range(0, 1), range(1, 2), range(2, 2)]
    assert stage_blocks(3, 1) == [range(0, 3)]
    cut = stage_blocks(6, 4)
    assert [b for r in cut for b in r] == list(range(6))
    assert max(len(r) for r in cut) == 2


def test_too_many_stages_are_refused():
    with pytest.raises(ValueError, match="at most 4 stages"):
        stage_blocks(2, 5)


@pytest.mark.timeout(300)
def test_the_example_script_matches_one_process_and_prints_bytes_per_dimension():
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "examples" / "gpt_3d.py"), "--mesh",
                           "2x1x2", "--steps", "2", "--batch", "4"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    gap = re.search(r"largest loss difference to one process: (\S+)", done.stdout)
    assert gap and float(gap.group(1)) < 1e-9, done.stdout
    for name in ("pp", "dp", "tp"):
        assert re.search(rf"^\s+{name}: ", done.stdout, re.M), done.stdout
