"""The large-batch experiment (minidist/experiments/large_batch.py) on tiny
configurations: the rates each rule computes, the warm-up's values, the
updates a batch-size schedule makes, the records' structure, LARS against
its formula on hand-computed numbers and on the experiment's model."""

import math

import numpy as np
import pytest

from minidist import Tensor, nn, optim
from minidist.data import load_digits
from minidist.experiments import large_batch as lb


@pytest.fixture(scope="module")
def tiny_data():
    x, y, x_test, y_test = load_digits()
    return x[:64], y[:64], x_test[:40], y_test[:40]


# --------------------------------------------------------------------------- rates


def test_scaled_lr_follows_each_rule():
    assert lb.scaled_lr(0.1, 16, 64, "none") == 0.1
    assert lb.scaled_lr(0.1, 16, 64, "linear") == pytest.approx(0.4)
    assert lb.scaled_lr(0.1, 16, 64, "sqrt") == pytest.approx(0.2)
    with pytest.raises(ValueError, match="unknown scaling 'cubic'"):
        lb.scaled_lr(0.1, 16, 64, "cubic")


def test_linear_rule_peak_rate_is_base_times_batch_ratio():
    rule = lb.Rule("r", "sgd", "linear", base_lr=0.02, warmup_epochs=2)
    for batch in (16, 48, 1442):
        assert rule.peak_lr(batch, 16) == pytest.approx(0.02 * batch / 16)


@pytest.mark.parametrize("batch, expected", [(16, 8), (20, 8), (64, 2), (40, 4)])
def test_warmup_lasts_the_given_epochs_in_updates(batch, expected):
    # 64 examples: 4, 4 (last batch of 4), 1 and 2 updates per epoch; 2 epochs of warm-up.
    rule = lb.Rule("r", "sgd", "linear", base_lr=0.01, warmup_epochs=2)
    assert rule.warmup_steps(batch, 64) == expected
    assert lb.Rule("r", warmup_epochs=0).warmup_steps(batch, 64) == 0
    # A fraction of an epoch at the full batch still warms up for one update.
    assert lb.Rule("r", warmup_epochs=0.3).warmup_steps(64, 64) == 1


def test_warmup_ramps_linearly_from_the_base_rate_to_the_peak():
    rule = lb.Rule("r", "sgd", "linear", base_lr=0.01, warmup_epochs=1)
    params = [Tensor(np.ones(3), requires_grad=True)]
    optimizer, scheduler = rule.build(params, batch_size=64, base_batch=16, dataset_size=256)
    assert isinstance(optimizer, optim.SGD)
    warmup = rule.warmup_steps(64, 256)
    assert warmup == 4
    peak = 0.04
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(warmup + 2):
        scheduler.step()
        seen.append(optimizer.param_groups[0]["lr"])
    expected = [0.01 + (peak - 0.01) * t / warmup for t in range(warmup)] + [peak] * 3
    np.testing.assert_allclose(seen, expected, rtol=1e-12)


def test_no_warmup_and_batches_below_the_base_keep_a_flat_rate():
    params = [Tensor(np.ones(3), requires_grad=True)]
    optimizer, scheduler = lb.RULES["linear"].build(params, 256, 16, 1024)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(lb.RULES["linear"].base_lr * 16)
    # Below the base batch the scaled rate is lower; the warm-up does not raise it.
    rule = lb.Rule("r", "sgd", "linear", base_lr=0.1, warmup_epochs=1)
    optimizer, scheduler = rule.build(params, 4, 16, 64)
    for _ in range(20):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
        scheduler.step()


def test_lars_rule_builds_lars_on_every_tensor():
    params = [Tensor(np.ones((2, 2)), requires_grad=True), Tensor(np.ones(2), requires_grad=True)]
    optimizer, _ = lb.RULES["lars"].build(params, 64, 16, 256)
    assert isinstance(optimizer, optim.LARS)
    assert optimizer.param_groups[0]["exclude_bias_and_norm"] is False


def test_bad_rules_and_batch_sizes_are_clear_errors(tiny_data):
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):
        lb.Rule("r", optimizer="adam")
    with pytest.raises(ValueError, match="base_lr > 0"):
        lb.Rule("r", base_lr=0)
    with pytest.raises(ValueError, match="batch size 65 must be an integer from 1 to the training set's 64"):
        lb.run_sweep([65], epochs=1, data=tiny_data)
    with pytest.raises(ValueError, match="unknown rule 'sqrt'"):
        lb.run_sweep([8], rules=["sqrt"], epochs=1, data=tiny_data)
    with pytest.raises(ValueError, match="grow to 100, more than the 64"):
        lb.run_batch_growth(epochs=3, milestones=[1, 2], gamma=0.1, initial_batch=1,
                            data=tiny_data)


# --------------------------------------------------------------------------- the sweep


def test_sweep_records_every_run_with_its_updates(tiny_data):
    rules = ["constant", "linear_warmup", "lars"]
    records = lb.run_sweep([8, 24, 64], rules=rules, epochs=2, seeds=(0, 1), data=tiny_data,
                           hidden=8)
    assert len(records) == 3 * 3 * 2
    assert [(r["rule"], r["batch_size"], r["seed"]) for r in records] == [
        (rule, batch, seed) for rule in rules for batch in (8, 24, 64) for seed in (0, 1)]
    for record in records:
        assert record["updates"] == 2 * math.ceil(64 / record["batch_size"])
        assert record["peak_lr"] == lb.RULES[record["rule"]].peak_lr(record["batch_size"], 16)
        assert 0 <= record["test_accuracy"] <= 1
        assert record["diverged"] is False
        assert isinstance(record["model"], nn.Module)
    summary = lb.summarise(records)
    assert list(summary) == rules
    for rows in summary.values():
        assert [row["batch_size"] for row in rows] == [8, 24, 64]
        assert all(row["seeds"] == 2 for row in rows)
    table = lb.format_summary(summary)
    assert table.splitlines()[0].split()[:2] == ["batch", "updates"]
    assert len(table.splitlines()) == 4


def test_a_run_is_repeatable_and_seeds_differ(tiny_data):
    first = lb.run_point(lb.RULES["linear"], 16, 2, seed=3, data=tiny_data, hidden=8)
    again = lb.run_point(lb.RULES["linear"], 16, 2, seed=3, data=tiny_data, hidden=8)
    other = lb.run_point(lb.RULES["linear"], 16, 2, seed=4, data=tiny_data, hidden=8)
    for a, b in zip(first["model"].parameters(), again["model"].parameters()):
        np.testing.assert_array_equal(a.data, b.data)
    assert not all(np.array_equal(a.data, c.data) for a, c in
                   zip(first["model"].parameters(), other["model"].parameters()))


def test_one_update_per_batch_in_the_shared_epoch_order(tiny_data):
    # The experiment's loop makes exactly the updates of a hand-written loop.
    x, y = tiny_data[0], tiny_data[1]
    model = lb.make_model(0, hidden=8)
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    history = lb.train(model, optimizer, tiny_data, 2, lambda epoch: 24, seed=5)
    assert [entry["updates"] for entry in history] == [3, 6]
    reference = lb.make_model(0, hidden=8)
    reference_optimizer = optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(2):
        order = lb.epoch_order(64, 5, epoch)
        for start in (0, 24, 48):
            indices = order[start:start + 24]
            reference_optimizer.zero_grad()
            nn.CrossEntropyLoss()(reference(Tensor(x[indices])), y[indices]).backward()
            reference_optimizer.step()
    for got, expected in zip(model.parameters(), reference.parameters()):
        np.testing.assert_array_equal(got.data, expected.data)


def test_a_diverging_run_stops_and_says_so(tiny_data):
    reckless = lb.Rule("reckless", "sgd", "none", base_lr=1e30)
    record = lb.run_point(reckless, 8, 5, data=tiny_data, hidden=8)
    assert record["diverged"] is True
    assert record["updates"] < 5 * 8
    assert not math.isfinite(record["train_loss"])


# --------------------------------------------------------------------------- batch growth


def test_batch_growth_makes_the_stated_updates_and_rates(tiny_data):
    results = lb.run_batch_growth(epochs=4, milestones=[1, 2], gamma=0.5, initial_batch=4,
                                  base_lr=0.1, max_batch_size=8, seeds=(0, 1), data=tiny_data,
                                  hidden=8)
    assert list(results) == ["no_decay", "decay_lr", "grow_batch", "hybrid"]
    expected = {
        # batch per epoch, rate per epoch; 64 examples
        "no_decay": ([4, 4, 4, 4], [0.1, 0.1, 0.1, 0.1]),
        "decay_lr": ([4, 4, 4, 4], [0.1, 0.05, 0.025, 0.025]),
        "grow_batch": ([4, 8, 16, 16], [0.1, 0.1, 0.1, 0.1]),
        "hybrid": ([4, 8, 8, 8], [0.1, 0.1, 0.05, 0.05]),
    }
    updates = {"no_decay": 64, "decay_lr": 64, "grow_batch": 16 + 8 + 4 + 4,
               "hybrid": 16 + 8 + 8 + 8}
    for name, runs in results.items():
        assert len(runs) == 2
        batches, rates = expected[name]
        for history in runs:
            assert [entry["batch_size"] for entry in history] == batches
            np.testing.assert_allclose([entry["lr"] for entry in history], rates, rtol=1e-12)
            assert history[-1]["updates"] == updates[name]
        schedule = optim.BatchSizeSchedule(4, [1, 2], 0.5)
        assert lb.schedule_updates(schedule.batch_size_at, 64, 4) == updates["grow_batch"]
        assert lb.mean_curve(runs, "updates")[-1] == updates[name]


# --------------------------------------------------------------------------- LARS


def test_lars_one_step_by_hand():
    # ||w|| = 5, ||g|| = 1, eta = 0.1, weight decay 0.2:
    # ratio = 0.1 * 5 / (1 + 0.2 * 5) = 0.25; d = 0.25 * (g + 0.2 w) = (0.3, 0.4).
    w = Tensor(np.array([[3.0, 4.0]]), requires_grad=True)
    optimizer = optim.LARS([w], lr=1.0, momentum=0.9, weight_decay=0.2, trust_coefficient=0.1)
    w.grad = np.array([[0.6, 0.8]])
    optimizer.step()
    assert optimizer.state[0]["trust_ratio"] == pytest.approx(0.25)
    np.testing.assert_allclose(w.data, [[2.7, 3.6]])
    # Second step: ||w|| = 4.5, g = (0.6, 0.8) again: ratio = 0.45 / 1.9;
    # buffer = 0.9 * (0.3, 0.4) + ratio * (g + 0.2 w).
    optimizer.step()
    ratio = 0.1 * 4.5 / (1 + 0.2 * 4.5)
    assert optimizer.state[0]["trust_ratio"] == pytest.approx(ratio)
    buffer = 0.9 * np.array([0.3, 0.4]) + ratio * (np.array([0.6, 0.8]) + 0.2 * np.array([2.7, 3.6]))
    np.testing.assert_allclose(w.data, [[2.7, 3.6]] - buffer, rtol=1e-12)


def test_lars_on_the_experiment_model_matches_its_formula(tiny_data):
    model = lb.make_model(0, hidden=8)
    x, y = tiny_data[0], tiny_data[1]
    nn.CrossEntropyLoss()(model(Tensor(x)), y).backward()
    before = [(p.data.astype(np.float64), p.grad.astype(np.float64)) for p in model.parameters()]
    lr, eta = 2.0, 0.001
    optimizer, _ = lb.Rule("l", "lars", "none", base_lr=lr, trust_coefficient=eta).build(
        model.parameters(), 16, 16, 64)
    optimizer.step()
    ratios = []
    for index, (param, (w, g)) in enumerate(zip(model.parameters(), before)):
        ratio = eta * np.linalg.norm(w) / np.linalg.norm(g)
        ratios.append(ratio)
        assert optimizer.state[index]["trust_ratio"] == pytest.approx(ratio, rel=1e-5)
        # Every tensor, biases included, moves by lr * eta * ||w|| on the first step.
        np.testing.assert_allclose(param.data, w - lr * ratio * g, rtol=1e-5, atol=1e-7)
        assert np.linalg.norm(param.data - w) == pytest.approx(lr * eta * np.linalg.norm(w),
                                                               rel=1e-4)
    assert len(set(np.round(ratios, 12))) == len(ratios)


# --------------------------------------------------------------------------- configuration


def test_reduced_form_is_part_of_the_full_one():
    quick, full = lb.configuration(False, 1442), lb.configuration(True, 1442)
    assert full["sweep"]["batch_sizes"] == [16, 32, 64, 128, 256, 512, 1024, 1442]
    assert set(quick["sweep"]["batch_sizes"]) <= set(full["sweep"]["batch_sizes"])
    assert quick["sweep"]["batch_sizes"][0] == 16 and quick["sweep"]["batch_sizes"][-1] == 1442
    assert len(quick["sweep"]["seeds"]) <= len(full["sweep"]["seeds"])
    assert lb.configuration(False, 100)["sweep"]["batch_sizes"][-1] == 100


def test_command_line_writes_the_table_and_pictures(tmp_path, monkeypatch, capsys, tiny_data):
    monkeypatch.setattr(lb, "digits_data", lambda: tiny_data)
    monkeypatch.setattr(lb, "configuration", lambda full, size: {
        "sweep": {"batch_sizes": [16, 64], "epochs": 1, "seeds": (0,), "hidden": 8},
        "growth": {"epochs": 2, "milestones": (1,), "gamma": 0.5, "initial_batch": 16,
                   "seeds": (0,), "hidden": 8},
    })
    assert lb.main(["--output", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "grow_batch" in printed and "constant" in printed
    for name in ("large_batch_accuracy.png", "batch_growth.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"
