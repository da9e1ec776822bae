"""`minidist demo memory`: DDP and ZeRO stages 1-3 on the digits MLP, the
ledger of each rank shown per strategy, model-state bytes equal to
zero_model_state_bytes, the trace's memory events drawn with --plot."""

import re

import pytest

from minidist import trace
from minidist.cli import DEMO_NPROC, STRATEGY_DEMOS, main
from minidist.memory import memory_timeline
from minidist.parallel.data.costs import zero_model_state_bytes
from minidist.train import build_model


@pytest.mark.timeout(120)
def test_demo_measures_each_stage_and_plots(tmp_path, capsys):
    assert STRATEGY_DEMOS["memory"] == "viz.demo_memory" and DEMO_NPROC["memory"] == 2
    path, picture = tmp_path / "memory.trace.jsonl", tmp_path / "memory.png"
    assert main(["demo", "memory", "--trace", str(path), "--plot", str(picture)]) == 0
    out = capsys.readouterr().out
    psi = build_model("mlp").num_parameters()
    for stage, name in enumerate(("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")):
        for rank in (0, 1):   # not a terminal: one plain line per rank and strategy
            assert re.search(rf"rank {rank}  {name}  step 3/3  params [\d.]+ KiB", out), out
        # each strategy's lines come in rank order, whichever rank finished first
        ranks = [int(r) for r in re.findall(rf"^rank (\d)  {name}  step 3/3", out, re.M)]
        assert ranks == [0, 1], out
        line = re.search(rf"  {name} +measured rank 0 ([\d,]+), rank 1 ([\d,]+)  formula ([\d,]+)",
                         out)
        assert line, out
        measured = {int(line.group(i).replace(",", "")) for i in (1, 2)}
        assert measured == {round(zero_model_state_bytes(psi, 2, stage))}
        assert int(line.group(3).replace(",", "")) == round(zero_model_state_bytes(psi, 2, stage))
    # Each peak says at which sample it was taken; the demo says its gradients
    # are held at the sample after forward (zeroed in place, set_to_none=False).
    assert re.search(r"  DDP +measured .*\n +peak per rank [\d,]+ after forward, [\d,]+ after "
                     r"forward\n", out), out
    assert "zero_grad(set_to_none=False) zeroes the gradients in place" in " ".join(out.split())
    # ZeRO-3's peak is above ZeRO-2's, and the demo says why from its numbers:
    # the gathered weights (all of the model's, in float32) among its activations.
    peaks = {name: re.search(rf"rank 0  {name}  step 3/3 .*(?:\n.*)? peak ([\d.]+ KiB)",
                             out).group(1)
             for name in ("ZeRO-2", "ZeRO-3")}
    note = re.search(r"ZeRO-3's peak per rank \(([\d.]+ KiB)\) is above ZeRO-2's \(([\d.]+ KiB)\)"
                     r"\. Of the ([\d.]+ KiB) of activations at its peak \(after forward\), "
                     r"([\d.]+ KiB) are gathered parameters: .* Without them ZeRO-3's peak would "
                     r"be ([\d.]+) KiB, below ZeRO-2's\.", " ".join(out.split()))
    assert note, out
    assert (note.group(1), note.group(2)) == (peaks["ZeRO-3"], peaks["ZeRO-2"])
    kib = [float(note.group(i).split()[0]) for i in (1, 2, 3, 4, 5)]
    assert kib[3] == pytest.approx(4 * psi / 1024, abs=0.1)      # every weight, gathered
    assert kib[3] < kib[2] and kib[4] < kib[1]
    assert kib[4] == pytest.approx(kib[0] - kib[3], abs=0.15)   # each rounded to 0.1 KiB
    assert picture.exists() and picture.stat().st_size > 0
    # The chart counts the gathered weights where they belong: a category of
    # their own, taken out of ZeRO-3's activations after forward; no other
    # strategy has any.
    from viz.memory_chart import memory_panels

    panels = memory_panels(path)
    for name, per_rank in panels.items():
        for series in per_rank.values():
            parts = [held.get("gathered_parameters", 0) for _, held in series]
            if name == "ZeRO-3":
                assert max(parts) == pytest.approx(4 * psi, abs=4 * 2 * 4), name
                assert all(held["activations"] >= 0 for _, held in series)
            else:
                assert not any(parts), name
    timeline = memory_timeline(trace.read_jsonl(path).events)
    assert set(timeline) == {0, 1}
    assert all(len(samples) == 4 * 3 * 4 for samples in timeline.values())  # 4 samples x 3 steps x 4


def test_demo_rejects_a_bad_process_count(capsys):
    assert main(["demo", "memory", "-n", "0"]) == 2
    assert "-n must be at least 1" in capsys.readouterr().out


def test_the_formula_gap_names_the_uneven_shards():
    from viz.demo_memory import shard_gap

    assert shard_gap(153_760, 153_760.0, [8192, 128, 1280, 10], 2) == ""
    assert shard_gap(102_520, 102_506.7, [8192, 128, 1280, 10], 3) == (
        "+13 B: 4 of 4 tensors do not split evenly in 3: shards rounded up, the formula is "
        "psi / N")
    assert shard_gap(1_010, 1_000.0, [8, 4], 2).endswith("no known cause (every tensor "
                                                         "splits evenly)")


def test_the_peak_note_chooses_its_words_from_the_numbers():
    from viz.demo_memory import peak_note

    def result(peak, activations, gathered):
        return {"peak": peak, "peak_label": "ZeRO-3 forward", "peak_activations": activations,
                "peak_gathered": gathered}

    above = peak_note([{"ZeRO-2": result(144_392, 48_000, 0),
                        "ZeRO-3": result(163_612, 86_700, 38_440)}])
    assert above.startswith("ZeRO-3's peak per rank (159.8 KiB) is above ZeRO-2's (141.0 KiB). ")
    assert "37.5 KiB are gathered parameters" in above and above.endswith("below ZeRO-2's.")
    level = peak_note([{"ZeRO-2": result(100_000, 10_000, 0),
                        "ZeRO-3": result(90_000, 20_000, 0)}])
    assert level == ("ZeRO-3's peak per rank (87.9 KiB) is not above ZeRO-2's (97.7 KiB): at "
                     "its peak no gathered weights are alive.")
    assert peak_note([{"DDP": result(1, 1, 0)}]) == ""
