"""The cost model on its own: fitting, parsing, formulas and the choice of
algorithm. (The simulator's tests check every formula against a run.)"""

import math

import numpy as np
import pytest

from minidist import costmodel
from minidist.costmodel import Params
from minidist.distributed.collectives.call import ALGORITHMS


def test_fit_recovers_alpha_and_beta_of_exact_data():
    sizes = [8, 1024, 65536, 1 << 20, 1 << 24]
    times = [5e-6 + size * 2e-10 for size in sizes]
    fitted = costmodel.fit(sizes, times)
    assert fitted.alpha == pytest.approx(5e-6, rel=1e-6)
    assert fitted.beta == pytest.approx(2e-10, rel=1e-6)
    assert fitted.bandwidth == pytest.approx(5e9, rel=1e-6)


def test_fit_needs_two_points():
    with pytest.raises(ValueError, match="at least two"):
        costmodel.fit([8], [1e-6])


@pytest.mark.parametrize("text, value", [("100MB", 100_000_000), ("64MiB", 64 << 20),
                                         ("4k", 4000), ("512", 512), (1024, 1024)])
def test_parse_size(text, value):
    assert costmodel.parse_size(text) == value


def test_parse_time_and_bandwidth():
    assert costmodel.parse_time("5us") == pytest.approx(5e-6)
    assert costmodel.parse_time("1.5ms") == pytest.approx(1.5e-3)
    assert costmodel.parse_bandwidth("10GB/s") == pytest.approx(1e10)
    with pytest.raises(ValueError, match="cannot read size"):
        costmodel.parse_size("12 parsecs")


def test_every_algorithm_has_a_formula():
    for collective, algorithms in ALGORITHMS.items():
        for algorithm in algorithms:
            seconds = costmodel.predict(collective, algorithm, 8, 1 << 20,
                                        params=costmodel.PARAMS["sim"])
            assert math.isfinite(seconds) and seconds > 0, (collective, algorithm)


def test_one_rank_costs_nothing_and_unknown_names_are_named():
    assert costmodel.predict("all_reduce", "ring", 1, 1 << 20) == 0.0
    with pytest.raises(ValueError, match="no cost model for all_reduce algorithm 'rign'"):
        costmodel.predict("all_reduce", "rign", 4, 1024)
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        costmodel.predict("all_reduce", "ring", 0, 1024)


def test_ring_formula_is_the_textbook_one():
    P = Params(alpha=5e-6, beta=1e-10, gamma=2e-11)
    n, N = 8, 64 << 20
    expected = 2 * (n - 1) * P.alpha + 2 * (n - 1) / n * N * P.beta + (n - 1) / n * N * P.gamma
    assert costmodel.predict("all_reduce", "ring", n, N, P) == pytest.approx(expected)


def test_auto_takes_few_steps_for_small_arrays_and_few_bytes_for_large_ones():
    P = Params(alpha=5e-6, beta=1e-10, gamma=1e-10)
    assert costmodel.best("all_reduce", 8, 4096, params=P) == "recursive_doubling"
    assert costmodel.best("all_reduce", 8, 256 << 20, params=P) in ("ring", "rabenseifner")
    # The ring's time is nearly flat in n; reduce + broadcast's grows with log n.
    ring = [costmodel.predict("all_reduce", "ring", n, 1e8, P) for n in (16, 1024)]
    tree = [costmodel.predict("all_reduce", "reduce_broadcast", n, 1e8, P) for n in (16, 1024)]
    assert tree[1] / tree[0] == pytest.approx(10 / 4)  # log2 1024 / log2 16
    assert ring[1] / ring[0] < 1.6  # only its 2 (n - 1) alpha grows


def test_exchange_beta_prices_only_the_steps_where_a_rank_sends_and_receives():
    duplex = Params(alpha=1e-6, beta=1e-10, gamma=0.0)
    shared_cpu = Params(alpha=1e-6, beta=1e-10, gamma=0.0, exchange_beta=2e-10)
    assert duplex.xbeta == duplex.beta and shared_cpu.xbeta == 2e-10
    n, N = 4, 1 << 26
    for algorithm in ("ring", "recursive_doubling", "rabenseifner"):
        slower = costmodel.predict("all_reduce", algorithm, n, N, shared_cpu)
        assert slower > 1.8 * costmodel.predict("all_reduce", algorithm, n, N, duplex)
    for algorithm in ("coordinator", "reduce_broadcast"):  # one direction at a time
        assert costmodel.predict("all_reduce", algorithm, n, N, shared_cpu) == \
            costmodel.predict("all_reduce", algorithm, n, N, duplex)


def test_traffic_is_known_for_every_algorithm():
    for collective, algorithms in ALGORITHMS.items():
        assert set(costmodel.TRAFFIC[collective]) == set(algorithms), collective
        for algorithm in algorithms:
            messages, nbytes = costmodel.TRAFFIC[collective][algorithm](4, 16, 4)
            assert messages >= 0 and nbytes >= 0


def test_the_fitted_defaults_are_plausible():
    for name, params in costmodel.PARAMS.items():
        assert 0 < params.alpha < 1e-3, name
        assert 0 < params.beta < 1e-8, name
        assert params.xbeta >= params.beta, name
    assert np.isfinite(costmodel.PARAMS["shm"].bandwidth)
