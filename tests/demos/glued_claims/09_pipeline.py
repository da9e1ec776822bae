"""Lesson 9's prose chose its words from its numbers: each verdict agrees
with the values it was chosen from."""


def _value(glued, name):
    return glued[name]["value"]


def check(glued):
    # section 3: measured minus replay at every m; the verdict looks at every step
    extras, ms = _value(glued, "extras"), _value(glued, "m_values")
    assert len(extras) == len(ms) and glued["extra_list"]["text"] == ", ".join(
        f"{extra:+.3f}" for extra in extras)
    trend = glued["extra_trend"]["text"]
    steps_up = [later > earlier for earlier, later in zip(extras, extras[1:])]
    if all(steps_up):
        assert trend.startswith("grew at every step")
    elif extras[-1] > extras[0]:
        assert trend.startswith("grew overall, but not at every step")
        for k, up in enumerate(steps_up):
            if not up:
                assert f"m = {ms[k]} to {ms[k + 1]}" in trend
    else:
        assert trend.startswith("did not grow")
    # the replay: "fell at every step" only if it did
    replays = _value(glued, "replays")
    falls = all(later < earlier for earlier, later in zip(replays, replays[1:]))
    assert glued["replay_trend"]["text"].startswith("fell at every step") == falls
    measured = _value(glued, "measured")
    falls = all(later < earlier for earlier, later in zip(measured, measured[1:]))
    assert glued["measured_trend"]["text"].startswith("fell at every step") == falls
    # the quick form says why its table stops early
    assert (glued["quick_note"]["text"] != "") == (ms[-1] < 16)
    assert _value(glued, "small_gap") >= 0 and _value(glued, "replay_off") >= 0

    # section 4: the 4-process bubble against the formula, and why
    over = _value(glued, "p4_bubble") - _value(glued, "p4_formula")
    assert abs(_value(glued, "p4_over") - over) < 1e-12
    few_cores = _value(glued, "p4_cores") < 4
    assert glued["p4_why"]["text"].startswith("four processes on") == few_cores

    # section 5: recomputation's cost
    assert glued["r_against_f"]["text"].startswith("no less") == \
        (_value(glued, "r_over_f_low") >= 1)
    low, high = _value(glued, "b_over_f_low"), _value(glued, "b_over_f_high")
    assert glued["b_against_2f"]["text"] == ("less than" if high < 2 else
                                             "more than" if low > 2 else "about")
    low, high = _value(glued, "r_share_low"), _value(glued, "r_share_high")
    assert glued["r_against_third"]["text"] == ("more than" if low > 1 / 3 else
                                                "less than" if high < 1 / 3 else "about")
    # "20 arrays ... with it 8", "the last stage ... 16 arrays against 7"
    assert abs(_value(glued, "saved_first") - (1 - 8 / 20)) < 1e-9
    assert abs(_value(glued, "saved_last") - (1 - 7 / 16)) < 1e-9

    # section 6: interleaving, more messages and more pieces held on stage 0
    assert 1 < _value(glued, "messages_v2") < _value(glued, "messages_v4")
    # (p v - 1)/(p - 1) times the messages with p = 4, as the text says: not v
    assert abs(_value(glued, "messages_v2") - 7 / 3) < 1e-9
    assert abs(_value(glued, "messages_v4") - 5) < 1e-9
    assert _value(glued, "worth_v1") < min(_value(glued, "worth_v2"),
                                            _value(glued, "worth_v4"))
