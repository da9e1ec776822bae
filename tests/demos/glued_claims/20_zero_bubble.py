"""Lesson 20's prose chose its words from its numbers: each verdict agrees
with the values it was chosen from."""

PAYS_LITTLE = 0.05   # the lesson's line: a twentieth of 1F1B's step


def value(glued, name):
    return glued[name]["value"]


def text(glued, name):
    return glued[name]["text"]


def check(glued):
    # Section 1: the split gives backward()'s bits; I leaves the weights' .grad empty.
    assert value(glued, "split_equal") is True
    assert text(glued, "split_verdict").startswith("the same bits")
    assert text(glued, "hand_verdict").startswith("equal bit for bit") == value(glued, "hand_equal")
    assert value(glued, "input_only") is True
    kept, formula = value(glued, "pending_bytes"), value(glued, "kept_formula")
    assert formula == 128 * (1000 + 500) * 4
    assert text(glued, "kept_verdict") == ("exactly" if kept == formula else
                                           "more than" if kept > formula else "less than")
    i_share, w_share = value(glued, "i_share"), value(glued, "w_share")
    halves = 0.35 <= i_share <= 0.65 and 0.35 <= w_share <= 0.65
    assert text(glued, "halves_verdict").startswith("each about half") == halves
    layer_over = value(glued, "layer_overhead") > value(glued, "layer_noise")
    assert text(glued, "overhead_verdict").startswith("more than") == layer_over
    assert text(glued, "one_product").startswith("it took about one product's") == halves

    # Section 2: the simulator's table.
    makespans = value(glued, "all_makespans")

    def compared(a, b):
        return "the same as" if a == b else "shorter than" if a < b else "longer than"

    equal = {name: makespans[f"4,8,111,{name}"] for name in
             ("1f1b", "zb_h1", "zb_h2", "zbv", "dualpipev")}
    unequal = {name: makespans[f"4,8,221,{name}"] for name in equal}
    assert value(glued, "h2_equal_idle") == 0          # "no bubble at all"
    assert text(glued, "h2_vs_h1_equal") == compared(equal["zb_h2"], equal["zb_h1"])
    assert text(glued, "h2_vs_h1_unequal") == compared(unequal["zb_h2"], unequal["zb_h1"])
    assert text(glued, "dp_vs_h1") == compared(equal["dualpipev"], equal["zb_h1"])
    both_v = min(equal, key=equal.get) == min(unequal, key=unequal.get) == "zbv"
    assert text(glued, "shortest_text").startswith("**the V is the shortest**") == both_v
    assert value(glued, "v_unequal_idle") > 0            # "with unequal costs ZB-V idles"
    assert value(glued, "dp_peak") - value(glued, "v_peak") == 0.5   # "half a stage more"
    assert value(glued, "v_peak") == value(glued, "f1b_peak")        # "as 1F1B's first stage"
    starts, ends = value(glued, "h2_starts"), value(glued, "h2_ends")
    slant = all(starts[r] == r and ends[r] == ends[0] + r for r in range(len(starts)))
    assert text(glued, "h2_slant").startswith("starts r units") == slant

    # Section 3: real processes.
    assert text(glued, "difference_verdict").startswith("the same weights") == \
        (value(glued, "worst_difference") < 1e-10)
    real = value(glued, "real_makespans")
    titles = {"1f1b": "1F1B", "zb_h1": "ZB-H1", "zb_h2": "ZB-H2", "zbv": "ZB-V",
              "dualpipev": "DualPipeV"}
    fast_noise = value(glued, "fastest_noise")

    def versus(a, b):
        gap = real[a] - real[b]
        if abs(gap) <= max(fast_noise[a], fast_noise[b]):
            return "equal"
        return "shorter" if gap < 0 else "longer"

    verdict = text(glued, "beat_verdict")
    for name in ("zb_h1", "zb_h2", "zbv", "dualpipev"):
        assert value(glued, "versus_1f1b")[name] == versus(name, "1f1b")
        assert titles[name] in value(glued, "beat_groups")[versus(name, "1f1b")]
    for word, phrase in (("shorter", "shorter than 1F1B's"), ("equal", "within the noise"),
                         ("longer", "longer by more")):
        assert (phrase in verdict) == bool(value(glued, "beat_groups")[word])
    fastest = min(real, key=real.get)
    assert text(glued, "fastest_real") == titles[fastest]
    replayed = value(glued, "replay_makespans")
    same = fastest == min(replayed, key=replayed.get)
    assert text(glued, "fastest_agree").startswith("it was the same") == same
    off = value(glued, "formula_off")
    assert text(glued, "formula_direction").startswith("above the formula for every") == \
        all(v > 0 for v in off.values())
    gaps = value(glued, "gaps")
    assert abs(value(glued, "gap_low") - min(gaps.values())) < 1e-9
    assert abs(value(glued, "gap_high") - max(gaps.values())) < 1e-9
    holds = value(glued, "holds")
    held = [titles[n] for n, ok in holds.items() if ok]
    assert text(glued, "holds_list") == (", ".join(held) or "none")
    assert text(glued, "real_busy").startswith("was busy") == value(glued, "real_busy_flag")
    assert ("longer than it" in text(glued, "w_sentence")) == \
        (value(glued, "later_w_over_i_value") > 1)
    assert value(glued, "stage0_i") < value(glued, "stage1_i")     # "I does nothing"
    if "p4_worst" in glued:
        assert value(glued, "p4_worst") < 1e-10

    # Section 4: a small W.
    assert text(glued, "w_shrinks") == ("smaller" if value(glued, "long_w_over_i")
                                        < value(glued, "short_w_over_i") else "not smaller")

    def pays(share):
        return "does not pay" if share <= 0 else "pays little" if share < PAYS_LITTLE else "pays"

    # The verdict is the net: the saving less the split's own cost.
    assert text(glued, "short_pays") == pays(value(glued, "short_net_share"))
    assert text(glued, "long_pays") == pays(value(glued, "long_net_share"))
    assert ("grew with T" in text(glued, "w_grew_text")) == value(glued, "w_grew")
    bf = value(glued, "bf_values")
    assert text(glued, "bf_text").startswith("the backward took less") == (max(bf) < 1)
    assert text(glued, "formula_words").startswith("equal to") == value(glued, "formula_agrees")
    for label, overhead, noise in zip(("short", "long"), value(glued, "overheads"),
                                      value(glued, "noises")):
        words = text(glued, f"{label}_overhead")
        if abs(overhead) <= noise:
            assert "within these timings' noise" in words
        else:
            assert ("above the noise" if overhead > 0 else "below zero") in words
    unsure = sum(abs(o) <= n for o, n in zip(value(glued, "overheads"), value(glued, "noises")))
    assert len(value(glued, "unsure_ts")) == unsure
    assert text(glued, "noise_caveat").startswith("Both costs lay outside") == (unsure == 0)

    # The ledger's memory.
    assert text(glued, "h2_more") == ("more than" if value(glued, "h2_over_h1") > 1
                                      else "no more than")
    more = value(glued, "h1_rank1") > value(glued, "f1b_rank1")
    assert text(glued, "rank1_more") == ("more" if more else "no more")
    assert text(glued, "rank1_text").startswith("more: its W's wait") == more
    assert value(glued, "h2_vs_h1_word") == versus("zb_h2", "zb_h1")
    assert text(glued, "h2_vs_h1_real").startswith(
        {"shorter": "a shorter", "equal": "a step equal", "longer": "a longer"}[
            versus("zb_h2", "zb_h1")])
    assert text(glued, "why_not_zero").startswith("(Not zero") == \
        (value(glued, "worst_difference") > 0)
    live0 = value(glued, "live0")
    first = text(glued, "first_rank_text")
    assert first.startswith("Both hold") == (live0[0] == live0[1])
    assert ("keeps more than" in first) == (value(glued, "pending0_mib") > value(glued, "record_mib"))
    assert ("shorter than 1F1B's" in text(glued, "h2_bought")) == (versus("zb_h2", "1f1b") == "shorter")
    assert ("shorter than 1F1B's" in text(glued, "h1_bought")) == (versus("zb_h1", "1f1b") == "shorter")
    assert ("within the noise" in text(glued, "h1_bought")) == (versus("zb_h1", "1f1b") == "equal")
