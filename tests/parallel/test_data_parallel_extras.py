"""Data parallel training's companions: stragglers, checkpoints, the sampler's epochs.

One traced launch on 2 ranks runs every case inside the workers and returns
what each rank saw; the tests below read those results and the trace:

* a straggler (rank 1, 3x slower) makes the fast rank's all_reduce wait for
  it: read as causality from the trace, never as a duration;
* train k steps, save, train k more == load in a fresh run and train the same
  k steps, bit for bit, for SGD with momentum and for Adam; bad files and
  write failures raise clear errors on every rank;
* DistributedSampler.set_epoch gives each epoch its own permutation, split
  into disjoint shards that cover the data, reproducibly from the seed; and
  forgetting it repeats the first epoch's order.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.data import DataLoader, DistributedSampler, load_digits
from minidist.parallel.data.checkpoint_files import load_checkpoint, save_checkpoint
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.parameter_server.straggler import Straggler

WORLD = 2
PER_RANK = 8
RESUME_STEPS = 5
STRAGGLER_STEPS = 4
SLOW_RANK, FACTOR = 1, 3.0
EPOCHS = 3


def _model(seed, hidden=24):
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def _optimizer(name, parameters):
    if name == "sgd":
        return optim.SGD(parameters, lr=0.1, momentum=0.9)
    if name == "adam":
        return optim.Adam(parameters, lr=0.01)
    raise ValueError(name)


def _flat(model):
    return np.concatenate([p.data.reshape(-1) for p in model.parameters()])


def _digest(model):
    return hashlib.sha256(_flat(model).tobytes()).hexdigest()


def _step(ddp, optimizer, step):
    x, y = load_digits()[:2]
    start = (step * WORLD + dist.get_rank()) * PER_RANK
    optimizer.zero_grad(set_to_none=False)
    nn.CrossEntropyLoss()(ddp(Tensor(x[start:start + PER_RANK])),
                          y[start:start + PER_RANK]).backward()
    optimizer.step()


# --------------------------------------------------------------------------- workers


def _straggler_steps():
    rank = dist.get_rank()
    x, y = load_digits()[:2]
    ddp = DistributedDataParallel(_model(seed=0), bucket_cap_mb=0.001, algorithm="ring")
    optimizer = optim.SGD(ddp.parameters(), lr=0.1)
    straggler = Straggler({SLOW_RANK: FACTOR})
    for step in range(STRAGGLER_STEPS):
        start = (step * WORLD + rank) * PER_RANK
        with trace.region(f"straggler step {step}", kind="step"):
            optimizer.zero_grad(set_to_none=False)
            with straggler.compute("forward"):
                loss = nn.CrossEntropyLoss()(ddp(Tensor(x[start:start + PER_RANK])),
                                             y[start:start + PER_RANK])
            loss.backward()
            optimizer.step()
    return straggler.factor


def _straggler_errors():
    problems = []
    for slow in ({1: 0.5}, {2: 2.0}, {0: float("inf")}, [1]):
        try:
            Straggler(slow)
        except (TypeError, ValueError) as error:
            problems.append(str(error))
    return problems


def _resume(optimizer_name, path):
    """Weights after 2k steps straight through (saving after k), and after
    loading that checkpoint into a fresh model and training the last k."""
    ddp = DistributedDataParallel(_model(seed=dist.get_rank()), bucket_cap_mb=0.002)
    optimizer = _optimizer(optimizer_name, ddp.parameters())
    for step in range(RESUME_STEPS):
        _step(ddp, optimizer, step)
    save_checkpoint(path, ddp, optimizer, epoch=1, step=RESUME_STEPS, note="halfway",
                    losses=np.arange(3, dtype=np.float32))
    for step in range(RESUME_STEPS, 2 * RESUME_STEPS):
        _step(ddp, optimizer, step)
    straight = _flat(ddp.module)

    fresh = DistributedDataParallel(_model(seed=100 + dist.get_rank()), bucket_cap_mb=0.002)
    fresh_optimizer = _optimizer(optimizer_name, fresh.parameters())
    extra = load_checkpoint(path, fresh, fresh_optimizer)
    loaded = _digest(fresh.module)
    for step in range(RESUME_STEPS, 2 * RESUME_STEPS):
        _step(fresh, fresh_optimizer, step)
    return {"straight": straight, "resumed": _flat(fresh.module), "loaded": loaded,
            "extra": extra}


def _error(call):
    try:
        call()
    except Exception as error:  # every rank must raise, and say what went wrong
        return type(error).__name__, str(error)
    return None


def _bad_files(directory):
    sgd_path = os.path.join(directory, "sgd.npz")
    model = _model(seed=0)
    adam = optim.Adam(model.parameters())
    wider = _model(seed=0, hidden=32)
    return {
        "missing": _error(lambda: load_checkpoint(os.path.join(directory, "nope.npz"), model)),
        "text": _error(lambda: load_checkpoint(os.path.join(directory, "text.npz"), model)),
        "foreign": _error(lambda: load_checkpoint(os.path.join(directory, "foreign.npz"),
                                                  model)),
        "other optimizer": _error(lambda: load_checkpoint(sgd_path, model, adam)),
        "other shape": _error(lambda: load_checkpoint(sgd_path, wider)),
        "unwritable": _error(lambda: save_checkpoint(
            os.path.join(directory, "no-such-folder", "x.npz"), model)),
    }


def _sampler_epochs(seed, set_epoch):
    """Train EPOCHS epochs through a DistributedSampler; the sample indices
    this rank read, per epoch."""
    x, y = load_digits()[:2]
    sampler = DistributedSampler(len(x), num_replicas=WORLD, rank=dist.get_rank(), seed=seed)
    loader = DataLoader((x, y, np.arange(len(x))), batch_size=256, sampler=sampler)
    ddp = DistributedDataParallel(_model(seed=0))
    optimizer = optim.SGD(ddp.parameters(), lr=0.1)
    epochs = []
    for epoch in range(EPOCHS):
        if set_epoch:
            sampler.set_epoch(epoch)
        seen = []
        for xb, yb, ib in loader:
            optimizer.zero_grad(set_to_none=False)
            nn.CrossEntropyLoss()(ddp(Tensor(xb)), yb).backward()
            optimizer.step()
            seen.append(ib)
        epochs.append(np.concatenate(seen))
    return epochs


def _worker(directory):
    return {
        "straggler factor": _straggler_steps(),
        "straggler errors": _straggler_errors(),
        "resume": {name: _resume(name, os.path.join(directory, f"{name}.npz"))
                   for name in ("sgd", "adam")},
        "errors": _bad_files(directory),
        "sampler": {
            "seed 0": _sampler_epochs(seed=0, set_epoch=True),
            "seed 0 again": _sampler_epochs(seed=0, set_epoch=True),
            "seed 1": _sampler_epochs(seed=1, set_epoch=True),
            "no set_epoch": _sampler_epochs(seed=0, set_epoch=False),
        },
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("extras")
    (directory / "text.npz").write_text("not an archive\n")
    np.savez(directory / "foreign.npz", weights=np.ones(3))
    path = directory / "run.trace.jsonl"
    results = minidist.launch(_worker, world_size=WORLD, transport="shm",
                              args=(str(directory),), trace=str(path), timeout=60)
    return results, trace.read_jsonl(path).events, directory


# --------------------------------------------------------------------------- stragglers


@pytest.mark.timeout(120)
def test_the_fast_rank_waits_for_the_straggler(run):
    results, events, _ = run
    assert [r["straggler factor"] for r in results] == [1.0, FACTOR]
    waits = [e for e in events if trace.label_text(e["label"]) == "straggler wait"]
    assert {e["rank"] for e in waits} == {SLOW_RANK}
    assert len(waits) == STRAGGLER_STEPS
    for wait in waits:
        info = trace.label_info(wait["label"])
        assert info["wait_ns"] == int((FACTOR - 1) * info["compute_ns"])
        assert wait["end"] - wait["start"] >= info["wait_ns"]

    fast = 1 - SLOW_RANK
    for step in range(STRAGGLER_STEPS):
        regions = {e["rank"]: e for e in events
                   if e["kind"] == "step" and e["label"] == f"straggler step {step}"}
        slow_wait = next(e for e in waits if regions[SLOW_RANK]["start"] <= e["start"]
                         <= regions[SLOW_RANK]["end"])
        fast_all_reduces = [e for e in events if e["rank"] == fast
                            and e["kind"] == "collective"
                            and trace.label_info(e["label"]).get("collective") == "all_reduce"
                            and regions[fast]["start"] <= e["start"] <= regions[fast]["end"]]
        assert len(fast_all_reduces) > 1, "the example count and at least one bucket"
        # The slow rank's gradients leave only after its wait: the fast rank's
        # last all_reduce cannot end earlier, and so neither can its step.
        assert max(e["end"] for e in fast_all_reduces) > slow_wait["end"]
        assert regions[fast]["end"] > slow_wait["end"]


@pytest.mark.timeout(120)
def test_straggler_rejects_bad_factors_and_ranks(run):
    results, _, _ = run
    for rank, problems in enumerate(r["straggler errors"] for r in results):
        assert len(problems) == 4
        assert all(f"rank {rank}" in problem for problem in problems[:3])
        assert "finite number >= 1" in problems[0] and "finite number >= 1" in problems[2]
        assert "ranks are 0..1" in problems[1]
        assert "dict" in problems[3]


# --------------------------------------------------------------------------- checkpoints


@pytest.mark.blas_kernel
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_resuming_from_a_checkpoint_is_bit_identical(run, name):
    results, _, directory = run
    per_rank = [r["resume"][name] for r in results]
    for result in per_rank:
        np.testing.assert_array_equal(result["resumed"], result["straight"])
        assert result["extra"]["epoch"] == 1 and result["extra"]["step"] == RESUME_STEPS
        assert result["extra"]["note"] == "halfway"
        np.testing.assert_array_equal(result["extra"]["losses"], np.arange(3, dtype=np.float32))
    assert per_rank[0]["loaded"] == per_rank[1]["loaded"]
    np.testing.assert_array_equal(per_rank[0]["resumed"], per_rank[1]["resumed"])

    # The checkpoint holds the model without DDP's "module." prefix, so a
    # plain model (and a single process) loads it.
    model = _model(seed=7)
    optimizer = _optimizer(name, model.parameters())
    extra = load_checkpoint(directory / f"{name}.npz", model, optimizer)
    assert extra["step"] == RESUME_STEPS
    assert optimizer.state, "the optimizer state came back"


@pytest.mark.timeout(120)
def test_bad_checkpoints_raise_clear_errors_on_every_rank(run):
    results, _, _ = run
    for rank, result in enumerate(results):
        errors = result["errors"]
        assert errors["missing"][0] == "FileNotFoundError"
        assert "nope.npz" in errors["missing"][1] and "rank 0" in errors["missing"][1]
        assert errors["text"][0] == "ValueError" and "not a checkpoint" in errors["text"][1]
        assert "not a minidist checkpoint" in errors["foreign"][1]
        assert "state of a SGD, not of this Adam" in errors["other optimizer"][1]
        assert "does not fit this model" in errors["other shape"][1]
        assert "size mismatch" in errors["other shape"][1]
        assert "could not write the checkpoint" in errors["unwritable"][1]
        for kind, (_, message) in errors.items():
            if kind != "unwritable" or rank != 0:
                assert f"rank {rank}" in message, (kind, message)


def test_checkpoint_outside_a_launch(tmp_path):
    model = _model(seed=0)
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = load_digits()[:2]
    nn.CrossEntropyLoss()(model(Tensor(x[:16])), y[:16]).backward()
    optimizer.step()
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scheduler.step()
    save_checkpoint(tmp_path / "one.npz", model, optimizer, epoch=4,
                    scheduler=scheduler.state_dict())
    other = _model(seed=1)
    other_optimizer = optim.SGD(other.parameters(), lr=0.5, momentum=0.1)
    other_scheduler = optim.lr_scheduler.StepLR(other_optimizer, step_size=1, gamma=0.5)
    extra = load_checkpoint(tmp_path / "one.npz", other, other_optimizer)
    assert extra["epoch"] == 4
    other_scheduler.load_state_dict(extra["scheduler"])
    scheduler.step()
    other_scheduler.step()
    assert other_scheduler.get_last_lr() == scheduler.get_last_lr() == [0.025]
    np.testing.assert_array_equal(_flat(other), _flat(model))
    assert other_optimizer.param_groups[0]["momentum"] == 0.9
    for index, state in optimizer.state.items():
        np.testing.assert_array_equal(other_optimizer.state[index]["momentum_buffer"],
                                      state["momentum_buffer"])
    with pytest.raises(ValueError, match="saved without optimizer"):
        save_checkpoint(tmp_path / "bare.npz", model)
        load_checkpoint(tmp_path / "bare.npz", other, other_optimizer)
    with pytest.raises(TypeError, match="cannot be stored"):
        save_checkpoint(tmp_path / "bad.npz", model, when=object())


# --------------------------------------------------------------------------- sampler


@pytest.mark.timeout(120)
def test_set_epoch_reshuffles_into_disjoint_covering_shards(run):
    results, _, _ = run
    size = len(load_digits()[0])
    runs = [r["sampler"] for r in results]
    for epoch in range(EPOCHS):
        shards = [r["seed 0"][epoch] for r in runs]
        assert sum(len(s) for s in shards) == size
        assert set(shards[0]).isdisjoint(shards[1])
        assert set(np.concatenate(shards)) == set(range(size))
    orders = [tuple(runs[0]["seed 0"][epoch]) for epoch in range(EPOCHS)]
    assert len(set(orders)) == EPOCHS, "every epoch gets its own order"
    for rank in range(WORLD):
        for epoch in range(EPOCHS):
            np.testing.assert_array_equal(runs[rank]["seed 0"][epoch],
                                          runs[rank]["seed 0 again"][epoch])
            assert not np.array_equal(runs[rank]["seed 0"][epoch], runs[rank]["seed 1"][epoch])


@pytest.mark.timeout(120)
def test_forgetting_set_epoch_repeats_the_first_order(run):
    results, _, _ = run
    for result in results:
        epochs = result["sampler"]["no set_epoch"]
        np.testing.assert_array_equal(epochs[0], result["sampler"]["seed 0"][0])
        for epoch in range(1, EPOCHS):
            np.testing.assert_array_equal(epochs[epoch], epochs[0])
