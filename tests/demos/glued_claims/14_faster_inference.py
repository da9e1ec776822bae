"""Lesson 14: every verdict its prose chose agrees with the run's numbers."""

import pytest


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    assert value["best_speedup"] > 0
    assert value["cores_verdict"].startswith("no more") == (
        value["best_speedup"] <= 1.1 * value["cores"])
    assert 3.9 < value["weights_smaller"] <= 4, "int8 weights: a quarter of float32's"
    assert value["accuracy_verdict"].startswith("the same") == (value["accuracy_gap"] <= 1)
    assert value["int8_verdict"].startswith("*slower*") == (value["int8_slower"] > 1)
    # Every budget the run trained is discussed, not only the first.
    hinton, hard = value["hinton_means"], value["hard_means"]
    wins = [h > d for h, d in zip(hinton, hard)]
    verdict = value["hinton_verdict"]
    assert verdict.startswith("beats") == all(wins) or verdict.startswith("beats at some")
    assert verdict.startswith("does not beat") == (not any(wins))
    assert value["hinton_vs_hard"].count("against") == len(hinton)
    helps = [f > d + 0.5 for f, d in zip(value["fitnets_means"], value["deep_hinton_means"])]
    assert (value["hints_verdict"] == "did not add anything") == (not any(helps))
    assert value["form_note"].startswith("This is the quick form") == (len(hinton) == 1)
    # 1 / C_out + 1 / f^2 at f = 3 for C_out 64 and 128: about 8 times fewer.
    assert value["madd_fewer_low"] == pytest.approx(1 / (1 / 64 + 1 / 9))
    assert value["madd_fewer_high"] == pytest.approx(1 / (1 / 128 + 1 / 9))
    assert (value["slower_somewhere"] != "") == (value["time_share_high"] > 1)
    assert value["depthwise_madds_high"] < 0.15
    if value["depthwise_verdict"] == "most of the time":
        assert value["depthwise_time_low"] > 0.5
    elif value["depthwise_verdict"].startswith("more of the time"):
        assert value["depthwise_time_low"] > value["depthwise_madds_high"]
