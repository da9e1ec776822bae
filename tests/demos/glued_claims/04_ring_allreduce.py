"""Lesson 4: what its text says of the measured ring against reduce +
broadcast, and of the simulated ring's formula, term by term, holds for the
numbers it printed."""

NBYTES, ALPHA, BETA, GAMMA = 100_000_000, 5e-6, 1e-10, 1e-10


def terms(n):
    return 2 * (n - 1) * ALPHA, 2 * (n - 1) / n * NBYTES * BETA, (n - 1) / n * NBYTES * GAMMA


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    text = {name: entry["text"] for name, entry in glued.items()}

    measured = {n: (ring, rb) for n, ring, rb in value["measured"]}
    worlds = sorted(measured)
    grew = all(measured[b][0] > measured[a][0] for a, b in zip(worlds, worlds[1:]))
    assert text["ring_trend"].startswith("it grew") == grew
    won = [n for n in worlds if measured[n][0] < measured[n][1]]
    wins = text["ring_wins"]
    if len(won) == len(worlds):
        assert wins.startswith("the ring was faster than reduce + broadcast on every world")
    elif not won:
        assert wins.startswith("reduce + broadcast was as fast or faster on every world")
    else:
        assert wins.startswith("the ring was faster on " + " and ".join(map(str, won)))

    # The ring's time is its three terms, and far from 2 N beta alone.
    for name, n in (("8", 8), ("last", value["last_n"])):
        latency, nbytes, additions = terms(n)
        assert text[f"ring_alpha_{name}"] == f"{latency * 1e3:.2f} ms"
        assert text[f"ring_beta_{name}"] == f"{nbytes * 1e3:.1f} ms"
        assert text[f"ring_gamma_{name}"] == f"{additions * 1e3:.1f} ms"
        assert abs(value[f"ring_sim_{name}"] - (latency + nbytes + additions) * 1e3) < 0.05
        assert value[f"ring_sim_{name}"] > 1.2 * 2 * NBYTES * BETA * 1e3
        assert nbytes + additions < 2 * NBYTES * BETA + NBYTES * GAMMA
    assert (text["sim_verdict"] == "the simulator charges exactly the formula") == \
        (value["sim_model_gap"] < 1e-9)
    step = 2 * (ALPHA + NBYTES * BETA) + NBYTES * GAMMA
    assert text["rb_step_model"] == f"{step * 1e3:.1f} ms"
    for part in text["rb_step"].split(" to "):
        assert abs(float(part.removesuffix(" ms")) - step * 1e3) < 0.01 * step * 1e3

    # "reduce + broadcast sends X times the ring's bytes, in ... steps": from the formulas.
    import math
    ratios, fewer = [], []
    for n, ring_bytes, ring_steps, rb_bytes, rb_steps in value["formula_counts"]:
        assert abs(ring_bytes - 2 * (n - 1) / n) < 1e-12 and ring_steps == 2 * (n - 1)
        assert rb_bytes == rb_steps == 2 * math.ceil(math.log2(n))
        assert rb_bytes > ring_bytes          # more bytes on every world measured
        ratios.append(f"{rb_bytes / ring_bytes:.1f}")
        if rb_steps < ring_steps:
            fewer.append(n)
        assert f"n = {n}: {rb_steps} steps against the ring's {ring_steps}" in text["steps_text"]
    assert text["bytes_ratios"] == ", ".join(ratios[:-1]) + " and " + ratios[-1] + " times"
    assert text["fewer_steps"].startswith("fewer steps only at") == bool(fewer)
