"""Lesson 13: the factors its text cites are the byte formulas', and every
verdict it chose agrees with the numbers it was chosen from."""

import pytest

from minidist.experiments import compression as experiment


def _fewer(name, world_size):
    shapes = experiment.parameter_shapes("mlp")
    return (experiment.formula_bytes("none", shapes, world_size)
            / experiment.formula_bytes(name, shapes, world_size))


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    text = {name: entry["text"] for name, entry in glued.items()}
    for name, compressor, world in (("fp16_fewer", "fp16", 2), ("bf16_fewer", "bf16", 2),
                                    ("int8_fewer", "int8", 2), ("int8_fewer_at_4", "int8", 4),
                                    ("topk_fewer", "top-k 1%", 2),
                                    ("powersgd_fewer", "PowerSGD r2", 2)):
        assert value[name] == pytest.approx(_fewer(compressor, world))
        assert text[name] == f"{_fewer(compressor, world):.1f}x"
    assert value["dettmers_send"] > value["dettmers_compute"] or \
        not value["send_verdict"].startswith("longer")
    assert value["send_verdict"].startswith("longer") == (value["dettmers_send"]
                                                          > value["dettmers_compute"])
    assert (value["topk_norm"] > 5 * value["randomk_norm"]) == (value["topk_verdict"] == "far more")
    assert value["cast_verdict"].startswith("lose nothing") == (value["cast_loss"] <= 0.5)
    assert value["topk_matches"].startswith("matches") == (value["topk_gap"] <= 0.5)
    assert value["sign_verdict"] in ("costs", "gains")
    assert (value["randomk_acc"] < value["none_acc"] - 10) == (value["randomk_verdict"] == "fails")
    assert (value["randomk_behind"].startswith("stays far behind")
            == (max(value["randomk_ef"], value["randomk_no_ef"]) < value["none_acc"] - 10))
    assert value["bytes_verdict"] == ("fewer" if value["powersgd_sent"] < value["plain_sent"]
                                      else "no fewer")
    assert value["messages_verdict"] == ("more" if value["powersgd_messages"]
                                         > value["plain_messages"] else "no more")
    # overlap=False: no message before the last gradient is ready (DDP sends from
    # the last gradient's hook); overlap=True: some leave while backward computes.
    assert value["no_overlap_verdict"].startswith("no message leaves before the last gradient")
    assert value["overlap_verdict"].startswith("leave while backward still computes") == (
        value["early_plain"] > 0 and value["early_powersgd"] > 0)
    assert value["count_algorithm"] == "one_shot"
    # Section 1: the ring's bytes are 2 (n-1)/n of the gradient's, the time on 1 Gbit/s theirs.
    assert value["dettmers_ring_bytes"] == pytest.approx(2 * 7 / 8 * 4 * 505_510)
    assert value["dettmers_send"] == pytest.approx(value["dettmers_ring_bytes"] * 8 / 1e6)
    assert value["dettmers_once"] == pytest.approx(4 * 505_510 * 8 / 1e6)
    # Random-k keeps k/Ψ of the squared norm: the square root of it of the norm.
    assert value["randomk_norm_share"] == pytest.approx(value["randomk_norm"] ** 0.5)
    # What one seed cannot show is not stated as a finding.
    one_seed = value["seeds"] == "1 seed"
    assert value["form_note"].startswith("This is the quick form") == one_seed
    assert ("one seed cannot say" in value["randomk_which"]) == one_seed
    assert ("changes from seed to seed" in value["randomk_which"]) <= (not one_seed)
    assert value["cheap_codec"] == ("a fraction of a millisecond" if value["cheap_ms"] < 1
                                    else "a millisecond or more")
    assert value["cheap_range"].startswith("in the gigabits") == (value["cheap_crossover"] >= 1)
    same = 1 / 3 <= value["saved_ratio"] / value["work_ratio"] <= 3
    assert value["crossover_verdict"].startswith("so its crossovers stay") == same
