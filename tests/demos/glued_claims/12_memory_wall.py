"""Lesson 12: what its prose chose to say of the run's numbers holds for them."""

import pytest


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    # Stage 3 gathers the weights twice: 1.5 times DDP's bytes (ZeRO's paper),
    # stage 2 what DDP sends, stage 1 DDP's all_reduce and an all_gather.
    assert value["stage3_volume"] == pytest.approx(1.5, abs=0.01)
    assert value["stage2_volume"] == pytest.approx(1.0, abs=0.01)
    assert value["stage1_volume"] == pytest.approx(1.5, abs=0.01)
    assert (value["ranks_spread"] == 0) == value["ranks_verdict"].startswith("Every rank holds")
    # ZeRO-3's peak, next to ZeRO-2's, with and without its gathered weights.
    peak2, peak3 = value["peak2"], value["peak3"]
    assert value["peak3_vs_2"] == ("above" if peak3 > peak2 else "not above")
    assert value["peak3_vs_2"] == "above", "the text explains a stage 3 peak above stage 2's"
    assert 0 < value["gathered3"] <= value["activations3"]
    assert value["peak3_without"] == pytest.approx(peak3 - value["gathered3"])
    assert value["without_vs_2"] == ("below" if value["peak3_without"] < peak2
                                     else "still not below")
    # Recomputation keeps fewer activations, fewer with longer segments.
    assert value["kept_every4"] < value["kept_every2"] < 1
    # The FLOP count: one more forward of the recomputed runs, every=2 more than every=4.
    assert 1 < value["flops_every4"] < value["flops_every2"] <= 4 / 3 + 1e-9
    near = all(abs(value[f"time_every{every}"] / value[f"flops_every{every}"] - 1) <= 0.10
               for every in (2, 4))
    assert value["flops_verdict"].startswith("near") == near
    above = all(value[f"time_every{every}"] / value[f"flops_every{every}"] - 1 > 0.10
                for every in (2, 4))
    if value["flops_verdict"].startswith("above"):
        assert above
    # The padding sentence follows the measured extras, and the note on the
    # example count's all_reduce names the bytes it measured.
    if value["padding_note"].startswith("In this run every model-state cell equals"):
        assert "n = 4" not in value["padding_note"].split("(")[0]
    assert value["count_algorithm"] == "one_shot"
    assert "bytes" in value["count_note"]
    assert value["form_note"].startswith("This is the quick form" if value["world"] == 2
                                         else "This is the full form")
