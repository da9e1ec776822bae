"""The distillation experiment (minidist.experiments.distillation), quick form:
what it must show: a student at least 4x smaller than its teacher that
beats the same student trained on hard labels alone, same seeds, on the mean
of several seeds. Plus the table and the plot."""

import numpy as np
import pytest

from minidist.experiments import distillation


@pytest.fixture(scope="module")
def results():
    return distillation.run(seeds=(0, 1, 2), budget=200)


def test_distilled_student_beats_the_hard_label_student_on_the_mean_of_the_seeds(results):
    assert results["teacher_parameters"] >= 4 * results["student_parameters"]
    assert results["teacher_parameters"] >= 4 * results["fitnets_parameters"]
    assert results["teacher_accuracy"] > 0.95
    assert len(results["accuracies"]["hard"]) == 3
    assert results["mean"]["hinton"] > results["mean"]["hard"]
    assert results["mean"]["fitnets"] > results["mean"]["fitnets_hard"]


def test_table_and_plot(results, tmp_path):
    text = distillation.format_table(results)
    for method in distillation.METHODS:
        assert method in text
    assert "70x smaller" in text
    path = distillation.plot([results], tmp_path / "distillation.png")
    assert path.exists() and path.stat().st_size > 0


def test_balanced_subset_and_bad_arguments():
    labels = np.repeat(np.arange(10), 20)
    subset = distillation.balanced_subset(labels, 50, seed=3)
    assert len(set(subset.tolist())) == 50
    assert np.bincount(labels[subset], minlength=10).tolist() == [5] * 10
    uneven = np.concatenate([np.zeros(3, int), np.ones(10, int)])
    assert sorted(distillation.balanced_subset(uneven, 13).tolist()) == list(range(13))
    assert np.bincount(uneven[distillation.balanced_subset(uneven, 8)]).tolist() == [3, 5]
    with pytest.raises(ValueError, match="budget must be between 10 and 200"):
        distillation.balanced_subset(labels, 5)
    with pytest.raises(ValueError, match="unknown methods"):
        distillation.run(methods=("magic",))
