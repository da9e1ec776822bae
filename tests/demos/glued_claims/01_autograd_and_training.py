"""Lesson 1: what its text says of the batching methods and of the time per
example holds for the numbers it printed."""


def check(glued):
    value = {name: entry["value"] for name, entry in glued.items()}
    text = {name: entry["text"] for name, entry in glued.items()}
    (gd, gd_updates, gd_read), (mini, mini_updates, mini_read), (sgd, sgd_updates, sgd_read) = \
        value["reached"]
    assert gd.startswith("batch GD") and mini.startswith("mini-batch") and sgd.startswith("SGD")
    assert text["gd_updates"] == str(gd_updates) and text["sgd_updates"] == str(sgd_updates)
    fastest = gd_updates < min(mini_updates, sgd_updates)
    assert (text["updates_verdict"] == "the fastest") == fastest
    assert (text["read_verdict"] == "sooner") == (sgd_read < min(gd_read, mini_read))
    assert text["read_ratio"] == f"{gd_read / sgd_read:.0f} times"
    between = (min(gd_updates, sgd_updates) <= mini_updates <= max(gd_updates, sgd_updates)
               and min(gd_read, sgd_read) <= mini_read <= max(gd_read, sgd_read))
    assert (text["mini_verdict"] == "sit in between on both counts") == between

    per_example = dict(value["per_example_us"])
    smallest, largest = min(per_example), max(per_example)
    fell = per_example[largest] < per_example[smallest]
    assert text["batch_verdict"] == ("fell" if fell else "rose")
    assert text["batch_change"].endswith("less" if fell else "more")
    assert text["per_example_1"] == f"{per_example[smallest]:.2f} us"
    assert text["per_example_256"] == f"{per_example[largest]:.2f} us"
    # Every step at which a larger batch was not faster per example is named.
    batches = sorted(per_example)
    reversed_steps = [[small, large] for small, large in zip(batches, batches[1:])
                      if per_example[large] >= per_example[small]]
    assert value["reversals"] == reversed_steps

    # "X's curve is smooth, Y's noisy": chosen from how often each loss rose by 1%.
    for name, share in value["rises"]:
        short = name.split(" (")[0]
        what = "smooth" if share < 0.05 else "noisy"
        group = [part for part in text["smooth_text"].split("; ") if f"{short}'s" in part]
        assert group and f" {what} (the loss rose by more than 1% at" in group[0], \
            (name, share, text["smooth_text"])
    first = min(value["reached"], key=lambda row: row[1])[0].split(" (")[0]
    assert text["first_curve"] == first
    # The floor is the noise's square and the target twice it.
    assert abs(float(text["floor"]) - float(text["noise"]) ** 2) < 1e-12
    assert abs(float(text["target"]) - 2 * float(text["floor"])) < 1e-12
