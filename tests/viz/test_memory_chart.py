"""viz/memory_chart.py draws the trace's memory events: the data behind the
plot (memory_panels) is exactly memory_timeline's entries inside each
strategy's 'memory step NAME' region, per rank."""

import numpy as np
import pytest

import minidist
from minidist import memory, nn, optim, trace
from minidist.tensor import Tensor
from viz.memory_chart import REGION_PREFIX, draw_memory, memory_panels


def _worker():
    rank = minidist.distributed.get_rank()
    nn.init.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    ledger = memory.Ledger(model, optimizer)
    x = np.ones((4 + rank, 8), np.float32)
    ledger.sample("outside")                      # not in a region: not drawn
    for name in ("A", "B"):
        with trace.region(REGION_PREFIX + name):
            optimizer.zero_grad()
            ledger.sample(f"{name} start")
            loss = model(Tensor(x)).sum()
            ledger.sample(f"{name} forward", graph=loss)
            loss.backward()
            ledger.sample(f"{name} backward")
            optimizer.step()
            ledger.sample(f"{name} step")
        ledger.sample("between")


@pytest.mark.timeout(60)
def test_the_plot_data_is_the_trace_memory_events(tmp_path):
    path = tmp_path / "t.jsonl"
    minidist.launch(_worker, world_size=2, transport="shm", trace=str(path), timeout=30)
    events = trace.read_jsonl(path).events
    panels = memory_panels(events)
    assert list(panels) == ["A", "B"]
    timeline = memory.memory_timeline(events)
    for name, per_rank in panels.items():
        assert set(per_rank) == {0, 1}
        for rank, series in per_rank.items():
            region = next(e for e in events if e["rank"] == rank and e["kind"] == "compute"
                          and e["label"] == REGION_PREFIX + name)
            expected = [(time - region["start"], held) for time, held in timeline[rank]
                        if region["start"] <= time <= region["end"]]
            assert series == expected and len(series) == 4
            # and the same numbers as the events' labels, read directly
            raw = sorted((e for e in events if e["rank"] == rank and e["kind"] == "memory"
                          and region["start"] <= e["start"] <= region["end"]),
                         key=lambda e: e["start"])
            for (time, held), event in zip(series, raw):
                info = trace.label_info(event["label"])
                assert time == event["start"] - region["start"]
                assert sum(held.values()) == int(info["total"]) == event["bytes"]
                assert held["optimizer_state"] == int(info["optimizer"])
    # rank 1's batch is bigger: more activations at forward
    assert panels["A"][1][1][1]["activations"] > panels["A"][0][1][1]["activations"]
    figure = draw_memory(str(path))
    assert len(figure.axes) == 2 * 2


def test_no_region_is_a_clear_error():
    with pytest.raises(ValueError, match="memory step NAME"):
        draw_memory([])
