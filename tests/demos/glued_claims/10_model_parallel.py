"""Lesson 10's prose chose its words from its numbers: each verdict agrees
with the values it was chosen from."""


def _value(glued, name):
    return glued[name]["value"]


def check(glued):
    # section 3: Dettmers' "about 4 times less", computed
    assert 3 < _value(glued, "dp_over_column") < _value(glued, "dp_over_row") < 4.5

    # section 6: a convolution has few weights per activation, a dense layer many
    conv_ratios = [float(ratio) for ratio in glued["conv_ratios"]["text"].split(" and ")]
    assert max(conv_ratios) < min(_value(glued, "dense_big_ratio"),
                                  _value(glued, "dense_last_ratio"))
    assert 0.5 < _value(glued, "dense_big_share") < 1

    # the hybrid pays at the small batch, not at the large one
    assert _value(glued, "mp_share_small") < _value(glued, "hybrid_share_small") < 1
    assert 1 < _value(glued, "mp_share_large") < _value(glued, "hybrid_share_large")
    assert _value(glued, "small_batch") < _value(glued, "cnn_crossing") \
        < _value(glued, "large_batch")
    assert _value(glued, "wide_crossing") >= 1000   # "batches in the thousands"

    # the step times: the verdicts follow this run's ratios against data parallel
    ratios = [_value(glued, name) for name in ("mp_time_small", "mp_time_large",
                                               "hybrid_time_small", "hybrid_time_large")]
    assert glued["fastest_verdict"]["text"].startswith("data parallel was the fastest") == \
        (min(ratios) >= 1)
    assert glued["mp_verdict"]["text"].startswith("which is what shows") == \
        (_value(glued, "mp_time_large") > _value(glued, "mp_time_small"))
    assert glued["hybrid_verdict"]["text"].endswith("as here") == \
        (_value(glued, "hybrid_time_small") > _value(glued, "hybrid_time_large"))

    # sections 4 and 5: the split MLP's accuracy, DistBelief's bytes
    assert glued["db_verdict"]["text"] == ("less than" if _value(glued, "db_sent")
                                           < _value(glued, "db_dp_bytes") else "no less than")
    assert _value(glued, "db_weights") > _value(glued, "db_hidden")

    # the quick form says that it trains and times less than the full form
    if "epochs" in glued:
        assert (glued["epochs_note"]["text"] != "") == (_value(glued, "epochs") < 10)
        assert (glued["windows_note"]["text"] != "") == (_value(glued, "windows") < 20)
