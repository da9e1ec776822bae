"""Lesson 11's prose chose its words from its numbers: each verdict agrees
with the values it was chosen from."""


def _value(glued, name):
    return glued[name]["value"]


def check(glued):
    # section 1: whether halving the conv's work halved the step
    ratio = _value(glued, "channel_ratio_2")
    assert glued["channel_halved"]["text"].startswith("yet halving") == (ratio > 0.5)
    if "channel_ratio_4" in glued:   # the full form's 4 ranks
        assert glued["channel_ratio_4"]["text"] in glued["channel_halved"]["text"]

    # section 2: the halo's share falls as one over the height, and the times
    assert _value(glued, "halo_first_share") > _value(glued, "halo_last_share")
    assert glued["halo_share_fell"]["text"] == "fell"
    share_ratio = _value(glued, "halo_first_share") / _value(glued, "halo_last_share")
    side_ratio = _value(glued, "halo_last_side") / _value(glued, "halo_first_side")
    assert abs(share_ratio - side_ratio) < 1e-9       # 1 / height exactly
    assert glued["time_verdict"]["text"].startswith("the conv's time grew more") == \
        (_value(glued, "conv_growth") > _value(glued, "halo_growth"))
    # the growth figures are the printed table's times divided, not unrounded ones
    times = _value(glued, "halo_times")
    assert glued["halo_growth"]["text"] == f"{times[-1][0] / times[0][0]:.1f}"
    assert glued["conv_growth"]["text"] == f"{times[-1][1] / times[0][1]:.1f}"
    # the quick form says that its images are smaller than the full form's 32x32 to 512x512
    assert (glued["sides_quick"]["text"] != "") == (_value(glued, "halo_last_side") < 512)

    # section 3: SyncBN follows one process, local BN differs from the first step
    assert _value(glued, "sync_gap") < 1e-3
    # the picture's floor: steps with equal losses are said to sit on it
    assert (_value(glued, "sync_zero_steps") > 0) == \
        glued["sync_zero_note"]["text"].startswith(" On ")
    assert (glued["bn_quick"]["text"] != "") == (_value(glued, "bn_steps") < 200)
    assert _value(glued, "local_first_gap") > 100 * _value(glued, "sync_gap")
    assert _value(glued, "local_gap") >= _value(glued, "local_first_gap")
    assert glued["local_learns"]["text"] == ("it still learns" if _value(glued, "local_accuracy")
                                             > 0.2 else "in this short run it has not learned yet")

    # section 4: the medians' and the fastest steps' verdict
    median_more = abs(_value(glued, "median_cost")) > abs(_value(glued, "fastest_cost"))
    assert glued["median_verdict"]["text"].startswith("the medians differ more") == median_more
