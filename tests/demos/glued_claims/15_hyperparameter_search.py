"""Lesson 15: every verdict its prose chose agrees with the run's numbers."""

import pytest


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    speedup, limit = value["speedup"], value["limit"]
    assert value["time_share"] == pytest.approx(1 / speedup)
    # the ratio is made of the two times the text prints
    assert speedup == pytest.approx(value["wall_one"] / value["wall_many"])
    verdict = value["speedup_verdict"]
    if speedup > 1.1 * limit:
        assert verdict.startswith("more than the cores allow")
    elif value["busy"]:
        assert verdict.startswith("but the machine was busy")
    elif speedup >= 0.8 * limit:
        assert verdict.startswith("near 1/n")
    else:
        assert verdict.startswith("more than 1/n")
    if "pruned" not in value:        # Optuna not installed: sections 4 and 5 skipped
        return
    assert value["two_verdict"].startswith("Most") == (2 * value["at_two"] > value["pruned"])
    share = value["pruned"] / value["trials"]
    assert value["pruned_share"] == pytest.approx(share)
    # the words follow the share: "about half" only near a half
    assert value["half_verdict"].startswith("about half") == (0.42 <= share < 0.58)
    if value["half_verdict"].startswith("about a third"):
        assert 0.29 <= share < 0.42
    if value["half_verdict"].startswith("about two thirds"):
        assert 0.58 <= share < 0.71
    saved = value["tuned_per_trial"] < value["random_per_trial"]
    assert value["saving_verdict"].startswith("The saving is") == saved
    # no "finishes sooner" after "saved no worker time"
    assert ("finishes sooner" in value["saving_then"]) == saved
