"""What lesson 18's prose says of the values it glued."""

import math


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    text = {name: entry["text"] for name, entry in glued.items()}
    # Section 1: one block at T = 4,096 is P and the rest (lesson 17's sum);
    # at 128k P is more than a terabyte and the rest needs several ranks.
    assert math.isclose(value["block_4096_gb"],
                        value["block_4096_p_gb"] + value["block_4096_rest_gb"], rel_tol=1e-9)
    assert value["p_128k_tb"] > 1
    assert value["ranks_128k"] > 1
    # Section 4, measured here: the messages' modelled time is a small part of a step.
    assert value["ring_comm_share"] < 0.5 and value["ulysses_comm_share"] < 0.5
    faster = [value["ring_vs_whole"] < 1, value["ulysses_vs_whole"] < 1]
    verdict = text["split_verdict"]
    if all(faster):
        assert verdict.startswith("Both were faster")
    elif not any(faster):
        assert verdict.startswith("Neither was faster")
    else:
        assert verdict.startswith("Only " + ("ring attention" if faster[0] else "Ulysses"))
    assert text["cores_busy"].startswith(
        "the machine was busy" if value["machine_busy"] else "the machine was not busy")
    # Section 4, predicted: a ring block hides its message within a node, not across.
    assert value["block_intra"] >= value["hide_intra"]
    assert value["block_inter"] < value["hide_inter"]
    assert value["n_intra"] <= 8 < value["n_inter"]
    # Section 2: both splits compute more than the causal triangle, the zig-zag less.
    assert value["triangle"] < value["zigzag_total"] < value["contiguous_total"]
    # Section 4, predicted: "Ulysses, sending 2/n of the ring's bytes".
    assert math.isclose(value["ulysses_share_inter"], 2 / value["n_inter"], rel_tol=1e-9)
    assert math.isclose(value["ulysses_share_formula"], 2 / value["n_inter"], rel_tol=1e-9)
    # The opening says which form ran; section 4's size note names this run's T and n.
    assert text["lesson_form"].startswith(
        "This is the lesson's **quick form**" if value["quick_form"] else
        "This is the lesson's **full form**")
    assert f"Here T = {value['measure_T']:,} on {value['measure_n']} ranks" in text["size_note"]
    assert ("the full form's can differ" if value["quick_form"] else
            "the quick form's can differ") in text["size_note"]
