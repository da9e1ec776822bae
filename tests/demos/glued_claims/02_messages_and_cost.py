"""Lesson 2: what its text says of the ping-pong table, of the two fits and of
the ring's measured / predicted holds for the numbers it printed."""

import statistics


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    text = {name: entry["text"] for name, entry in glued.items()}

    times = dict(value["shm_pingpong"])
    sizes = sorted(times)
    assert text["floor_verdict"].startswith("hardly changes") == \
        (times[1024] < 1.5 * times[sizes[0]])
    step, growth = sizes[-1] / sizes[-2], times[sizes[-1]] / times[sizes[-2]]
    assert (text["proportion_verdict"] == "about in proportion to the size") == \
        (0.7 < growth / step < 1.4)
    bandwidth = {size: size / seconds for size, seconds in times.items()}
    peak = max(bandwidth.values())
    assert text["peak_bandwidth"] == f"{peak / 1e9:.2f} GB/s"
    last = bandwidth[sizes[-1]]
    assert text["bandwidth_verdict"].startswith(
        "at the largest size" if last == peak else "and levels off" if last >= 0.75 * peak
        else "and falls again")

    fits = {name: (alpha, beta) for name, alpha, beta in value["fits"]}
    dearer = (fits["pipe"][0] > fits["shm"][0], fits["pipe"][1] > fits["shm"][1])
    assert text["pipe_verdict"].startswith("The pipe pays more on both counts") == all(dearer)
    assert text["shm_alpha"] == f"{fits['shm'][0] * 1e6:.1f} us"

    ratios = {}
    for world, _, ratio in value["ring_ratios"]:
        ratios.setdefault(world, []).append(ratio)
    for world, values in ratios.items():
        assert f"from {min(values):.2g}x to {max(values):.2g}x on {world} ranks" in \
            text["ratio_spans"]
    if len(ratios) > 1:
        first, last = min(ratios), max(ratios)
        grew = statistics.median(ratios[last]) > statistics.median(ratios[first])
        assert ("did not grow" in text["ratio_verdict"]) == (not grew)
