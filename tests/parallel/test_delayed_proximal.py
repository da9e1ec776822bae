"""D2P: delayed proximal block gradient, one process with explicit delays and real processes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minidist
import minidist.distributed as dist
from minidist import trace
from minidist.data.synthetic import make_sparse_logistic
from minidist.parallel.parameter_server import delayed_proximal as d2p

FEATURES, LABELS, _ = make_sparse_logistic(600, 40, 8, seed=1, dtype=np.float64)
WORKERS, BLOCKS, STEPS, L1 = 3, 4, 200, 0.01
# Half of 1 / L: stable for every delay tested here (delayed gradients want a smaller step).
STEP_SIZE = 0.5 * d2p.default_step_size(FEATURES)
THRESHOLD = 0.1  # a "significant change" of a coordinate of a shard's summed gradient
RUNS = [(0, None), (1, None), (4, None), (8, None), (2, THRESHOLD)]  # (tau, filter), tau distinct


# --------------------------------------------------------------------------- the numerics


@given(st.lists(st.floats(-1e6, 1e6), max_size=20), st.floats(0, 1e3))
def test_soft_threshold_is_its_formula(values, threshold):
    values = np.array(values, np.float64)
    expected = [v - threshold if v > threshold else v + threshold if v < -threshold else 0.0
                for v in values]
    np.testing.assert_array_equal(d2p.soft_threshold(values, threshold), expected)


def test_soft_threshold_is_the_l1_proximal_operator():
    """It minimises 0.5 (x - v)^2 + t |x| (checked on a fine grid)."""
    grid = np.linspace(-3, 3, 60001)
    for v in (-2.5, -0.3, 0.0, 0.2, 1.7):
        best = grid[np.argmin(0.5 * (grid - v) ** 2 + 0.5 * np.abs(grid))]
        assert abs(d2p.soft_threshold(np.array([v]), 0.5)[0] - best) <= 1e-4


def test_blocks_cover_every_coordinate_once():
    bounds = d2p.block_bounds(10, 3)
    assert bounds[0][0] == 0 and bounds[-1][1] == 10
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert max(stop - start for start, stop in bounds) - min(stop - start
                                                              for start, stop in bounds) <= 1
    with pytest.raises(ValueError, match="from 1 to the number of features"):
        d2p.block_bounds(10, 11)


def test_block_gradient_is_the_logistic_gradient():
    weights = np.linspace(-1, 1, FEATURES.shape[1])
    margins = FEATURES @ weights
    full = FEATURES.T @ (1 / (1 + np.exp(-margins)) - LABELS)
    np.testing.assert_allclose(d2p.shard_block_gradient(FEATURES, LABELS, weights, 5, 17),
                               full[5:17], rtol=1e-12)


# --------------------------------------------------------------------------- one process


def reference(tau=0, threshold=None):
    delays = d2p.max_delay_schedule(STEPS, WORKERS, tau)
    return d2p.delayed_proximal_reference(FEATURES, LABELS, WORKERS, BLOCKS, STEPS, STEP_SIZE,
                                          L1, delays, threshold)


@pytest.mark.parametrize("tau", [1, 4, 8])
def test_the_largest_delays_allowed_reach_the_undelayed_objective(tau):
    undelayed = reference(0).objectives[-1]
    assert abs(reference(tau).objectives[-1] - undelayed) <= 0.01 * undelayed


def test_the_l1_step_makes_weights_sparse_and_lowers_the_objective():
    result = reference(0)
    assert result.objectives[-1] < d2p.objective(np.zeros(FEATURES.shape[1]), FEATURES, LABELS,
                                                 L1)
    assert 0 < np.count_nonzero(result.weights) < FEATURES.shape[1]


def test_delays_that_look_into_the_future_are_refused():
    delays = np.zeros((STEPS, WORKERS), int)
    delays[2, 1] = 3
    with pytest.raises(ValueError, match="between 0 and t"):
        d2p.delayed_proximal_reference(FEATURES, LABELS, WORKERS, BLOCKS, STEPS, STEP_SIZE, L1,
                                       delays)


# --------------------------------------------------------------------------- processes


def all_runs():
    return [d2p.delayed_proximal_gradient(FEATURES, LABELS, BLOCKS, STEPS, STEP_SIZE, L1, tau,
                                          threshold) for tau, threshold in RUNS]


@pytest.fixture(scope="module")
def process_runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("d2p") / "d2p.trace.jsonl"
    results = minidist.launch(all_runs, world_size=WORKERS + 1, transport="shm", trace=path)
    # by run, then by rank
    return [[results[rank][run] for rank in range(WORKERS + 1)] for run in range(len(RUNS))], \
        trace.read_jsonl(path).events


@pytest.mark.blas_kernel
@pytest.mark.timeout(120)
def test_tau_zero_on_processes_is_the_proximal_block_gradient_bit_for_bit(process_runs):
    runs, _ = process_runs
    expected = reference(0)
    for rank_result in runs[0]:
        np.testing.assert_array_equal(rank_result["weights"], expected.weights)


@pytest.mark.blas_kernel
@pytest.mark.timeout(120)
def test_replaying_the_logged_delays_in_one_process_gives_the_same_bits(process_runs):
    """Whatever the timing made the delays, the reference fed those delays agrees exactly
    (filtered pushes included): the processes compute what the algorithm says."""
    runs, _ = process_runs
    for run, (_, threshold) in enumerate(RUNS):
        logged = np.array([worker["delays"] for worker in runs[run][1:]]).T
        expected = d2p.delayed_proximal_reference(FEATURES, LABELS, WORKERS, BLOCKS, STEPS,
                                                  STEP_SIZE, L1, logged, threshold)
        np.testing.assert_array_equal(runs[run][0]["weights"], expected.weights)
        assert runs[run][0]["pushed"] == expected.pushed
        assert runs[run][0]["filtered"] == expected.filtered


@pytest.mark.timeout(120)
def test_delayed_runs_on_processes_reach_the_undelayed_objective(process_runs):
    runs, _ = process_runs
    undelayed = d2p.objective(runs[0][0]["weights"], FEATURES, LABELS, L1)
    for run, (tau, _) in enumerate(RUNS):
        if tau > 0:  # the filtered run too: holding back small changes costs little
            found = d2p.objective(runs[run][0]["weights"], FEATURES, LABELS, L1)
            assert abs(found - undelayed) <= 0.01 * undelayed, tau
        for worker in runs[run][1:]:  # every pull arrived: the workers hold the server's weights
            np.testing.assert_array_equal(worker["weights"], runs[run][0]["weights"])


@pytest.mark.timeout(120)
def test_the_filter_holds_back_coordinates_and_counts_them(process_runs):
    runs, _ = process_runs
    offered = STEPS * FEATURES.shape[1] // BLOCKS * WORKERS
    for run, (_, threshold) in enumerate(RUNS):
        server = runs[run][0]
        assert server["pushed"] + server["filtered"] == offered
        assert server["pushed"] == sum(worker["pushed"] for worker in runs[run][1:])
        assert (server["filtered"] > 0) == (threshold is not None)


@pytest.mark.timeout(120)
def test_delays_never_exceed_tau_in_results_and_trace(process_runs):
    runs, events = process_runs
    for run, (tau, _) in enumerate(RUNS):
        for worker in runs[run][1:]:
            assert len(worker["delays"]) == STEPS
            assert max(worker["delays"]) <= tau
    pushes = [event for event in events if event["kind"] == "send"
              and trace.label_info(event["label"]).get("kind") == "push"]
    pulls_received = [event for event in events if event["kind"] == "recv"
                      and trace.label_info(event["label"]).get("kind") == "pull"]
    for tau, threshold in RUNS:
        messages = 1 if threshold is None else 2  # the filter sends positions, then values
        mine = [event for event in pushes if trace.label_info(event["label"])["tau"] == tau]
        assert len(mine) == messages * STEPS * WORKERS
        assert all(trace.label_info(event["label"])["delay"] <= tau for event in mine)
        assert all(trace.label_info(event["label"])["block"] ==
                   trace.label_info(event["label"])["step"] % BLOCKS for event in mine)
    # Causality: a push of step t left only after its rank received the pull of step t - tau - 1.
    pull_end = {}
    for event in pulls_received:
        info = trace.label_info(event["label"])
        pull_end[event["rank"], info["tau"], info["step"]] = event["end"]
    assert len(pull_end) == len(pulls_received) == STEPS * WORKERS * len(RUNS)
    for push in pushes:
        info = trace.label_info(push["label"])
        needed = info["step"] - info["tau"] - 1
        if needed >= 0:
            assert pull_end[push["rank"], info["tau"], needed] <= push["start"]


@pytest.mark.timeout(60)
def test_a_server_without_workers_is_a_clear_error():
    def alone():
        return d2p.delayed_proximal_gradient(FEATURES, LABELS, BLOCKS, 1, STEP_SIZE, L1, 0)

    with pytest.raises(dist.WorkerError, match="needs a server and at least one worker"):
        minidist.launch(alone, world_size=1)
