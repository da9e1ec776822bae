"""The parameter server against single-process SGD, and its consistency modes' promises.

Launches (each runs all its cases inside the workers; the parent compares):

* ``synchronous`` (9 ranks, shm): every (servers S, workers W) with S in
  {1, 2, 4} and W in {1, 2, 3, 5}, all twelve pairs, runs in a subgroup of the
  first S + W ranks (one after the other; the other ranks wait in the next
  one). Each runs BSP on linear regression with uneven worker shards, with and
  without momentum, and SSP with tau = 0; (2, 3) also trains the digits MLP.
* ``asynchronous`` (5 ranks, pipe, traced): async with one worker, async,
  SSP and drop with three workers in round-robin and arrival order, n_fetch /
  n_push, a warm-up, and the bad-input errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist
import minidist.distributed as dist
from minidist import Tensor, nn, trace
from minidist.data import load_digits, make_linear_regression
from minidist.examples.parameter_server import (
    digits_mlp,
    linear_regression_gradient,
    split_rows,
    train_linear_regression,
    train_mlp_on_digits,
)
from minidist.parallel.parameter_server.layout import Layout, flat_parameters, shard_ranges
from minidist.parallel.parameter_server.server import ParameterServer

STEPS = 12
LR = 0.05
SAMPLES, FEATURES = 61, 6
PAIRS = [(s, w) for s in (1, 2, 4) for w in (1, 2, 3, 5)]
UNEVEN = [7, 1, 3, 20, 5]        # worker k's share of the rows, in proportion
MLP_PAIR, MLP_STEPS, MLP_BATCH = (2, 3), 6, 5


def _data():
    return make_linear_regression(SAMPLES, FEATURES, noise=0.1, seed=3, dtype=np.float64)


def _uneven_rows(workers: int) -> list[slice]:
    weights = np.array(UNEVEN[:workers], float)
    bounds = np.round(np.cumsum(np.concatenate([[0], weights])) / weights.sum() * SAMPLES)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _regression_run(group, servers, steps=STEPS, rows=None, **options):
    x, y, _, _ = _data()
    ps = ParameterServer(np.linspace(-1, 1, FEATURES + 1), servers=servers, lr=LR,
                         group=group, **options)
    rows = rows if rows is not None else _uneven_rows(ps.layout.workers)

    def gradient_fn(weights, worker, step):
        return linear_regression_gradient(weights, x[rows[worker]], y[rows[worker]])

    return ps.run(steps, gradient_fn)


# --------------------------------------------------------------------------- references


def _full_batch_sgd(steps=STEPS, momentum=0.0):
    """One process, the whole data set every step, SGD as torch writes it."""
    x, y, _, _ = _data()
    weights, buffer = np.linspace(-1, 1, FEATURES + 1), None
    for _ in range(steps):
        residual = x @ weights[:-1] + weights[-1] - y
        gradient = np.concatenate([x.T @ residual, [residual.sum()]]) * (2 / len(y))
        if momentum:
            buffer = gradient.copy() if buffer is None else buffer * momentum + gradient
            gradient = buffer
        weights = weights - LR * gradient
    return weights


def _sequential_sgd(rows, steps, momentum=0.0):
    """One worker's SGD, step after step, in one process."""
    x, y, _, _ = _data()
    weights, buffer = np.linspace(-1, 1, FEATURES + 1), None
    for _ in range(steps):
        gradient = linear_regression_gradient(weights, x[rows], y[rows])[0]
        if momentum:
            if buffer is None:
                buffer = gradient.copy()
            else:
                buffer *= momentum
                buffer += gradient
            gradient = buffer
        weights -= LR * gradient
    return weights


# --------------------------------------------------------------------------- launch 1


def _synchronous_program():
    out = {}
    for servers, workers in PAIRS:
        group = dist.new_group(list(range(servers + workers)))
        if not group.is_member:
            continue
        key = (servers, workers)
        out[key + ("bsp",)] = _regression_run(group, servers, mode="bsp")
        out[key + ("bsp momentum",)] = _regression_run(group, servers, mode="bsp", momentum=0.9)
        out[key + ("ssp 0",)] = _regression_run(group, servers, mode="ssp", tau=0)
        if key == MLP_PAIR:
            out[key + ("mlp",)] = train_mlp_on_digits(
                MLP_STEPS, servers=servers, lr=0.5, batch_size=MLP_BATCH, dtype=np.float64,
                group=group)
    return out


@pytest.fixture(scope="module")
def synchronous():
    return minidist.launch(_synchronous_program, world_size=9, transport="shm", timeout=120)


def _runs(results, key):
    return [rank_results[key] for rank_results in results if key in rank_results]


@pytest.mark.blas_kernel
@pytest.mark.timeout(300)
@pytest.mark.parametrize("servers,workers", PAIRS)
def test_bsp_equals_full_batch_sgd(synchronous, servers, workers):
    for case, momentum in (("bsp", 0.0), ("bsp momentum", 0.9)):
        runs = _runs(synchronous, (servers, workers, case))
        assert len(runs) == servers + workers
        assert [r.role for r in runs] == ["server"] * servers + ["worker"] * workers
        for run in runs[1:]:
            assert np.array_equal(run.weights, runs[0].weights), "ranks disagree"
        np.testing.assert_allclose(runs[0].weights, _full_batch_sgd(momentum=momentum),
                                   rtol=0, atol=1e-10, err_msg=f"{case}, S={servers} W={workers}")
        for server in runs[:servers]:
            assert server.version == STEPS
            assert len(server.pushes) == STEPS * workers
            assert all(record.staleness == 0 and record.accepted for record in server.pushes)


@pytest.mark.blas_kernel
@pytest.mark.timeout(300)
def test_sharded_bsp_is_bitwise_the_single_server_run(synchronous):
    for workers in (1, 2, 3, 5):
        for case in ("bsp", "bsp momentum"):
            single = _runs(synchronous, (1, workers, case))[0].weights
            for servers in (2, 4):
                if (servers, workers) in PAIRS:
                    sharded = _runs(synchronous, (servers, workers, case))[0].weights
                    assert np.array_equal(sharded, single), (case, servers, workers)


@pytest.mark.blas_kernel
@pytest.mark.timeout(300)
def test_ssp_with_tau_zero_is_bitwise_bsp(synchronous):
    for servers, workers in PAIRS:
        bsp = _runs(synchronous, (servers, workers, "bsp"))[0]
        ssp = _runs(synchronous, (servers, workers, "ssp 0"))[0]
        assert np.array_equal(bsp.weights, ssp.weights), (servers, workers)


@pytest.mark.timeout(300)
def test_mlp_on_digits_by_bsp_equals_one_process(synchronous):
    servers, workers = MLP_PAIR
    runs = _runs(synchronous, MLP_PAIR + ("mlp",))
    x, y, _, _ = load_digits(dtype=np.float64)
    rows = split_rows(len(y), workers)
    model = digits_mlp(dtype=np.float64)
    weights = flat_parameters(model)
    for step in range(MLP_STEPS):
        batch = slice(step * MLP_BATCH, (step + 1) * MLP_BATCH)
        xs = np.concatenate([x[r][batch] for r in rows])
        ys = np.concatenate([y[r][batch] for r in rows])
        model.zero_grad()
        nn.functional.cross_entropy(model(Tensor(xs)), ys).backward()
        weights = weights - 0.5 * np.concatenate([p.grad.reshape(-1) for p in model.parameters()])
        offset = 0
        for p in model.parameters():
            p.data[...] = weights[offset:offset + p.data.size].reshape(p.data.shape)
            offset += p.data.size
    np.testing.assert_allclose(runs[0].weights, weights, rtol=0, atol=1e-10)
    losses = [r.losses for r in runs if r.role == "worker"]
    assert all(len(worker_losses) == MLP_STEPS for worker_losses in losses)


# --------------------------------------------------------------------------- launch 2


def _errors(message_of):
    world = dist.world_group()
    weights = np.zeros(4)
    cases = {
        "servers >= world": dict(servers=dist.get_world_size()),
        "unknown mode": dict(mode="hogwild"),
        "tau < 0": dict(mode="ssp", tau=-1),
        "ssp without tau": dict(mode="ssp"),
        "bsp with tau": dict(mode="bsp", tau=2),
        "async with tau": dict(mode="async", tau=2),
        "n_push in bsp": dict(mode="bsp", n_push=2),
        "unknown order": dict(order="random"),
        "more servers than weights": dict(servers=4, initial_weights=np.zeros(3)),
    }
    for name, options in cases.items():
        initial = options.pop("initial_weights", weights)
        try:
            ParameterServer(initial, lr=0.1, group=world, **options)
        except ValueError as error:
            message_of[name] = str(error)
        else:
            message_of[name] = None


def _asynchronous_program():
    rank = dist.get_rank()
    out = {}
    one_worker = dist.new_group([0, 1])
    two_servers_one_worker = dist.new_group([0, 1, 2])
    three_workers = dist.new_group([0, 1, 2, 3])
    two_servers_three_workers = dist.world_group()
    if one_worker.is_member:
        out["async 1"] = _regression_run(one_worker, 1, mode="async", momentum=0.9)
    if two_servers_one_worker.is_member:
        out["async 1 sharded"] = _regression_run(two_servers_one_worker, 2, mode="async")
    if three_workers.is_member:
        out["round robin"] = _regression_run(three_workers, 1, mode="async",
                                             order="round_robin")
        out["warm-up"] = _regression_run(three_workers, 1, mode="async", order="round_robin",
                                         warmup_steps=4, keep_gradients=True)
        out["fetch and push"] = _regression_run(three_workers, 1, mode="async", n_fetch=3,
                                                n_push=2, order="round_robin",
                                                keep_gradients=True)
    for tau in (1, 2):
        out[f"ssp {tau}"] = _regression_run(two_servers_three_workers, 2, mode="ssp", tau=tau,
                                            steps=20)
    out["ssp round robin"] = _regression_run(two_servers_three_workers, 2, mode="ssp", tau=2,
                                             order="round_robin", steps=20)
    out["drop"] = _regression_run(two_servers_three_workers, 2, mode="drop", tau=1, steps=20,
                                  keep_gradients=True)
    out["drop round robin"] = _regression_run(two_servers_three_workers, 2, mode="drop",
                                              tau=1, steps=20, order="round_robin",
                                              keep_gradients=True)
    out["linear regression"] = train_linear_regression(
        300, servers=2, mode="async", lr=0.05, n_samples=200, n_features=5, noise=0.01,
        batch_size=10, seed=1)
    out["no steps"] = _regression_run(two_servers_three_workers, 2, mode="bsp", steps=0)
    out["errors"] = {}
    _errors(out["errors"])
    out["rank"] = rank
    return out


@pytest.fixture(scope="module")
def asynchronous(tmp_path_factory):
    path = tmp_path_factory.mktemp("ps") / "async.jsonl"
    results = minidist.launch(_asynchronous_program, world_size=5, transport="pipe",
                              timeout=120, trace=str(path))
    return results, trace.read_jsonl(path).events


@pytest.mark.blas_kernel
@pytest.mark.timeout(300)
def test_async_with_one_worker_is_sequential_sgd(asynchronous):
    results, _ = asynchronous
    everything = slice(0, SAMPLES)
    assert np.array_equal(results[0]["async 1"].weights,
                          _sequential_sgd(everything, STEPS, momentum=0.9))
    assert np.array_equal(results[0]["async 1 sharded"].weights,
                          _sequential_sgd(everything, STEPS))


@pytest.mark.timeout(300)
def test_round_robin_async_has_staleness_workers_minus_one(asynchronous):
    results, _ = asynchronous
    records = results[0]["round robin"].pushes
    workers = 3
    assert len(records) == workers * STEPS
    assert [r.staleness for r in records[:workers]] == list(range(workers))
    assert {r.staleness for r in records[workers:]} == {workers - 1}
    assert [r.worker for r in records] == list(range(workers)) * STEPS


@pytest.mark.timeout(300)
def test_warm_up_is_synchronous_then_async(asynchronous):
    results, _ = asynchronous
    server = results[0]["warm-up"]
    warmup, workers = 4, 3
    synchronous_part = server.pushes[:warmup * workers]
    assert all(r.step < warmup and r.staleness == 0 for r in synchronous_part)
    asynchronous_part = server.pushes[warmup * workers:]
    assert [r.staleness for r in asynchronous_part[:workers]] == list(range(workers))
    assert {r.staleness for r in asynchronous_part[workers:]} == {workers - 1}
    assert server.version == warmup + (STEPS - warmup) * workers
    _check_replay(server, np.linspace(-1, 1, FEATURES + 1))


@pytest.mark.timeout(300)
def test_n_fetch_and_n_push(asynchronous):
    results, _ = asynchronous
    workers = [r["fetch and push"] for r in results if "fetch and push" in r][1:]
    assert [w.pushes for w in workers] == [STEPS // 2] * 3
    assert [w.pulls for w in workers] == [STEPS // 3] * 3
    server = results[0]["fetch and push"]
    assert len(server.pushes) == 3 * (STEPS // 2)
    assert [r.step for r in server.pushes if r.worker == 0] == list(range(1, STEPS, 2))
    _check_replay(server, np.linspace(-1, 1, FEATURES + 1))


@pytest.mark.timeout(300)
def test_ssp_staleness_never_exceeds_tau(asynchronous):
    results, _ = asynchronous
    for case, tau in (("ssp 1", 1), ("ssp 2", 2), ("ssp round robin", 2)):
        for server in results[:2]:
            records = server[case].pushes
            assert len(records) == 3 * 20
            assert max(r.staleness for r in records) <= tau, case
            assert server[case].version == 20
    round_robin = [r.staleness for r in results[0]["ssp round robin"].pushes]
    assert max(round_robin) > 0, "with tau > 0 a worker computes on weights not yet updated"


def _check_replay(server, initial):
    """Applying only the logged gradients, in order, in one process gives the weights."""
    start, stop = server.key_range
    weights = initial[start:stop].copy()
    for gradient in server.applied_gradients:
        weights -= LR * gradient
    assert len(server.applied_gradients) == server.version
    assert np.array_equal(weights, server.weights[start:stop])


@pytest.mark.timeout(300)
def test_drop_counts_and_replay(asynchronous):
    results, _ = asynchronous
    for case in ("drop", "drop round robin"):
        for server in (results[0][case], results[1][case]):
            assert server.accepted + server.dropped == len(server.pushes) == 3 * 20
            assert all(r.staleness <= 1 for r in server.pushes if r.accepted)
            assert all(r.staleness > 1 for r in server.pushes if not r.accepted)
            assert server.version == server.accepted
            _check_replay(server, np.linspace(-1, 1, FEATURES + 1))
    assert results[0]["drop round robin"].dropped > 0


@pytest.mark.timeout(300)
def test_async_linear_regression_finds_the_true_weights(asynchronous):
    results, _ = asynchronous
    _, _, true_weights, true_bias = make_linear_regression(200, 5, 0.01, 1, np.float64)
    found = results[0]["linear regression"].weights
    np.testing.assert_allclose(found, np.append(true_weights, true_bias), atol=0.01)


@pytest.mark.timeout(300)
def test_bad_input_is_a_clear_error(asynchronous):
    results, _ = asynchronous
    for rank_results in results:
        messages = rank_results["errors"]
        assert all(messages.values()), [name for name, m in messages.items() if not m]
        rank = rank_results["rank"]
        assert all(f"rank {rank}" in message for message in messages.values())
    messages = results[0]["errors"]
    assert "no worker" in messages["servers >= world"]
    assert "bsp, ssp, async, drop" in messages["unknown mode"]
    assert "tau" in messages["tau < 0"] and "-1" in messages["tau < 0"]


@pytest.mark.timeout(300)
def test_every_message_is_labelled(asynchronous):
    results, events = asynchronous
    pushes = [e for e in events if e["kind"] == "send"
              and trace.label_info(e["label"]).get("kind") == "push"]
    pulls = [e for e in events if e["kind"] == "send"
             and trace.label_info(e["label"]).get("kind") == "pull"]
    updates = [e for e in events if e["kind"] == "compute"
               and trace.label_info(e["label"]).get("kind") == "update"]
    assert pushes and pulls and updates
    assert all({"worker", "step", "version"} <= set(trace.label_info(e["label"]))
               for e in pushes)
    assert all({"worker", "step", "staleness", "accepted"} <= set(trace.label_info(e["label"]))
               for e in updates)
    # Every drop the servers logged is in the trace, as an update that was not accepted.
    for server_rank in (0, 1):
        logged = sum(value.dropped for value in results[server_rank].values()
                     if hasattr(value, "dropped"))
        traced = [e for e in updates if e["rank"] == server_rank
                  and trace.label_info(e["label"])["accepted"] == 0]
        assert len(traced) == logged > 0
    # Each pull a worker made is one reply received from each server it pulled from.
    replies = [e for e in events if e["kind"] == "recv" and e["rank"] == 4
               and trace.label_info(e["label"]).get("kind") == "pull"]
    pulls_made = sum(value.pulls for value in results[4].values() if hasattr(value, "pulls"))
    # Rank 4 takes part only in the runs with two servers.
    assert {"async 1", "async 1 sharded", "round robin", "warm-up",
            "fetch and push"}.isdisjoint(results[4])
    assert len(replies) == 2 * 2 * pulls_made   # two servers, a header and the weights


@pytest.mark.timeout(300)
def test_no_steps_returns_the_initial_weights_everywhere(asynchronous):
    results, _ = asynchronous
    for rank_results in results:
        assert np.array_equal(rank_results["no steps"].weights, np.linspace(-1, 1, FEATURES + 1))
    assert results[0]["no steps"].version == 0 and not results[0]["no steps"].pushes


def test_layout_and_key_ranges():
    layout = Layout.for_world(7, 2)
    assert (layout.servers, layout.workers) == (2, 5)
    assert [layout.role(r) for r in range(7)] == ["server"] * 2 + ["worker"] * 5
    assert layout.worker_rank(0) == 2 and layout.worker_of(6) == 4
    assert shard_ranges(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert shard_ranges(3, 3) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ValueError, match="no worker"):
        Layout.for_world(2, 2)


def _wrong_gradient_shape():
    ps = ParameterServer(np.zeros(4), servers=1, lr=0.1)
    return ps.run(2, lambda weights, worker, step: (np.zeros(3), 1))


@pytest.mark.timeout(60)
def test_a_gradient_of_the_wrong_shape_names_the_worker():
    with pytest.raises(minidist.distributed.WorkerError, match=r"rank 1 \(worker 0\).*flat"):
        minidist.launch(_wrong_gradient_shape, world_size=2, transport="shm", timeout=30)
