"""Lesson 3: what its text says of the bytes per rank, of which all_reduce won,
and of the simulated curves holds for the numbers it printed."""

NBYTES, ALPHA, BETA, GAMMA = 100_000_000, 5e-6, 1e-10, 1e-10


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    text = {name: entry["text"] for name, entry in glued.items()}

    # No rank of the ring sends more than 2 (n-1)/n arrays; the coordinator's n - 1.
    assert value["ring_share"] <= value["ring_bound"] + 1e-9 < 2
    assert value["coordinator_share"] > value["ring_share"]

    (_, small_won, small_pick), (_, large_won, large_pick) = value["winners"]
    agrees = (small_won, large_won) == (small_pick, large_pick)
    assert text["winners_verdict"].startswith("the run agrees") == agrees
    assert text["below_text"].startswith("no algorithm") == (not value["below_model"])

    curves = {algorithm: dict(points) for algorithm, points in value["sim_curves"]}
    ring, rb = curves["ring"], curves["reduce_broadcast"]
    largest = max(ring)
    assert text["ring_8"] == f"{ring[8] * 1e3:.1f} ms"
    assert text["ring_last"] == f"{ring[largest] * 1e3:.1f} ms"
    # "its bytes and additions near 2 N beta + N gamma, and its latencies are
    # 2 (n-1) alpha of it": the ring is within a few percent of the sum of the two.
    limit = 2 * NBYTES * BETA + NBYTES * GAMMA
    assert abs(ring[largest] - (limit + 2 * (largest - 1) * ALPHA)) < 0.01 * limit
    # "climbs by ... each time the world doubles: 2 (alpha + N beta) + N gamma"
    worlds = sorted(rb)
    step = 2 * (ALPHA + NBYTES * BETA) + NBYTES * GAMMA
    for small, large in zip(worlds, worlds[1:]):
        assert abs(rb[large] - rb[small] - step) < 0.01 * step
        assert f"{(rb[large] - rb[small]) * 1e3:.1f} ms" in text["rb_step"]
    assert (text["model_verdict"] == "exactly") == (value["model_gap"] < 1e-9)

    # "largest gap": the largest either way, measured above or below the model.
    gaps = value["gap_ratios"]
    widest = max(gaps, key=lambda gap: max(gap[2], 1 / gap[2]))
    assert value["largest_gap"] == widest
    # "ring, Rabenseifner and two_shot win on large arrays": the text says whether
    # this run's largest size is large enough for the model to pick one of them.
    large_pick = value["winners"][-1][2]
    assert text["large_expect"].endswith("one of them") == \
        (large_pick in ("ring", "rabenseifner", "two_shot"))
    # The ring's growth is the run's, next to reduce + broadcast's.
    assert text["ring_growth"] == f"{ring[largest] / ring[8] - 1:.0%}"
    assert text["rb_growth"] == f"{rb[largest] / rb[8]:.1f} times"
