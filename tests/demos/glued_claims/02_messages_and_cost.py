"""Lesson 2: what its text says of the ping-pong table, of the two fits and of
the ring's measured / predicted holds for the numbers it printed."""

import statistics


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    text = {name: entry["text"] for name, entry in glued.items()}

    times = dict(value["shm_pingpong"])
    sizes = sorted(times)
    # The floor verdict looks at every small size, not only at two of them.
    small = [times[size] for size in value["floor_sizes"]]
    assert value["floor_sizes"] == [size for size in sizes if size <= 4096]
    flat = max(small) < 1.5 * min(small)
    rising = all(b >= a for a, b in zip(small, small[1:])) and max(small) < 10 * min(small)
    assert text["floor_verdict"].startswith(
        "hardly changes" if flat else "already grows" if rising else "shows no floor")
    for size in value["floor_sizes"]:
        assert f"{times[size] * 1e6:.1f} us at {size:,} bytes" in text["floor_verdict"]
    step, growth = sizes[-1] / sizes[-2], times[sizes[-1]] / times[sizes[-2]]
    assert (text["proportion_verdict"] == "about in proportion to the size") == \
        (0.7 < growth / step < 1.4)
    bandwidth = {size: size / seconds for size, seconds in times.items()}
    peak = max(bandwidth.values())
    assert text["peak_bandwidth"] == f"{peak / 1e9:.2f} GB/s"
    last = bandwidth[sizes[-1]]
    peak_size = max(bandwidth, key=bandwidth.get)
    after = [bandwidth[size] for size in sizes if size > peak_size]
    # "levels off" must hold at every size after the peak, not only at the last one
    assert text["bandwidth_verdict"].startswith(
        "at the largest size" if last == peak else "and levels off"
        if all(b >= 0.75 * peak for b in after) else "and falls again")

    fits = {name: (alpha, beta) for name, alpha, beta in value["fits"]}
    dearer = (fits["pipe"][0] > fits["shm"][0], fits["pipe"][1] > fits["shm"][1])
    pipe = dict(value["pipe_pingpong"])
    faster = [size for size in sizes if pipe[size] < times[size]]
    assert value["pipe_faster"] == faster
    # "pays more on both counts" only where the fit and every row of the table agree
    assert text["pipe_verdict"].startswith("The pipe pays more on both counts") == \
        (all(dearer) and not faster)
    for size in faster:
        assert f"{size:,} bytes (" in text["pipe_verdict"]
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

    # Every row far from its prediction is named, right after "near 1 says ...".
    far = [[world, size, ratio] for world, size, ratio in value["ring_ratios"]
           if not 0.5 <= ratio <= 2]
    assert value["far_rows"] == far
    assert text["far_text"].startswith("Every row is within") == (not far)
    for world, size, ratio in far:
        assert f"{world} ranks at {size // 1024:,} KiB ({ratio:.2g}x)" in text["far_text"]
