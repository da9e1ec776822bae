"""What lesson 19's prose says of its run, against the values it glued."""

EVEN = 0.25   # an even share of the 4 experts of section 4's model


def value(glued, name):
    return glued[name]["value"]


def check(glued):
    # Section 4: how close to an even quarter Switch's 0.01 left the busiest
    # expert, whether fewer choices were dropped, and whether 0.1 evened more.
    busiest = {name: value(glued, f"busiest_{name}") for name in ("off", "switch", "strong")}
    lost = {name: value(glued, f"lost_{name}") for name in ("off", "switch", "strong")}
    closeness = value(glued, "switch_closeness")
    if busiest["switch"] <= 1.2 * EVEN:
        assert closeness == "close to an even quarter"
    else:
        assert closeness == f"still {busiest['switch'] / EVEN:.1f} times an even quarter"
        assert "close to" not in closeness
    assert value(glued, "switch_dropped") == ("fewer" if lost["switch"] < lost["off"] else "no fewer")
    more = busiest["strong"] < busiest["switch"] and lost["strong"] < lost["switch"]
    assert value(glued, "strong_verdict") == ("evens them more" if more else "does not even them more")
    assert busiest["off"] > 0.7   # "the router collapses"

    # The loss: "hurt" only beyond twice the two means' combined noise; the
    # sentence's direction is the numbers'.
    loss = {name: value(glued, f"loss_{name}") for name in ("off", "switch", "strong")}
    noise = {name: value(glued, f"noise_{name}") for name in ("off", "switch", "strong")}
    for name in ("switch", "strong"):
        gap = loss[name] - loss["off"]
        band = 2 * (noise[name] ** 2 + noise["off"] ** 2) ** 0.5
        verdict = value(glued, f"{name}_loss_verdict")
        if abs(gap) <= band:
            assert verdict.startswith("no different within the noise")
        else:
            assert verdict.startswith("higher" if gap > 0 else "lower")
    band = 2 * (noise["switch"] ** 2 + noise["off"] ** 2) ** 0.5
    hurt = loss["switch"] - loss["off"] > band
    assert value(glued, "switch_hurt") == ("hurt" if hurt else "did not hurt")
    # The drops in the sentence print the table's digits.
    assert glued["lost_switch"]["text"] == f"{lost['switch']:.1%}"
    # Switch's general finding (too large a coefficient costs loss) set against
    # this run: "agrees", "the opposite" or "cannot tell", from 0.1's numbers.
    gap = loss["strong"] - loss["off"]
    band = 2 * (noise["strong"] ** 2 + noise["off"] ** 2) ** 0.5
    general = value(glued, "strong_general")
    if gap > band:
        assert general.startswith("this run agrees")
    elif gap < -band:
        assert general.startswith("this run shows the opposite")
        lowest = min(loss, key=loss.get) == "strong"
        assert ("with the lowest loss of the three" in general) == lowest
        fewest = min(lost, key=lost.get) == "strong"
        assert ("dropped the fewest choices" in general) == fewest
    else:
        assert general.startswith("this run cannot tell")

    # Section 5: the rows that crossed a link, against the even figure (both
    # without the counts); the shortfall named is the dropped choices, and
    # the direction of the kept choices' spread is the numbers'.
    for k, run in value(glued, "crossed").items():
        assert all(r < run["even_rows"] for r in run["rows"])
        assert run["dropped"] > 0 and run["kept"] == run["choices"] - run["dropped"]
        assert run["even_rows"] == run["choices"] // 2     # 2 (n-1)/n k B T a rank, n = 2
        assert all(b == r * value(glued, "row_bytes") for b, r in zip(run["bytes"], run["rows"]))
        word = ("more than" if run["remote_share"] > 0.5 else
                "as many as" if run["remote_share"] == 0.5 else "fewer than")
        assert f"with k = {k}, {run['remote_share']:.0%} of the kept choices went to the other " \
               f"rank's experts, {word} the even spread's share" in value(glued, "remote_verdict")

    # Section 6: the latencies' share grows with the ranks; k = 2's extra
    # cost, being bytes, is a smaller part at more ranks.
    assert value(glued, "latency_fewest") < value(glued, "latency_most")
    assert value(glued, "k2_ratio_fewest") > value(glued, "k2_ratio_most") > 1
