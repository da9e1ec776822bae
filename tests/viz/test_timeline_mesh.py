"""The timeline coloured by mesh dimension, on a traced 3D run.

One traced launch of 8 ranks trains a tiny GPT one step on a pp2 x dp2 x tp2
mesh (:class:`~minidist.parallel.mesh.gpt_3d.GPT3D`, 1F1B); the workers return the
group id of each of their mesh groups (and of the embedding group, which runs
along pp). What the timeline infers from the ranks' coordinates alone must
agree with the groups the messages were really sent in; the figure must draw
each dimension in its own colour with a legend naming it.
"""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_hex

import minidist
import minidist.distributed as dist
from minidist import optim, trace
from minidist.distributed.device_mesh import init_device_mesh, mesh_layout, trace_header
from minidist.models.gpt import GPT, GPTConfig
from minidist.parallel.mesh.gpt_3d import GPT3D, MESH_DIMS
from minidist.parallel.pipeline.executor import annotate_trace
from tests.viz.text_layout import text_problems
from viz import timeline

SHAPE = (2, 2, 2)
CONFIG = GPTConfig(vocab_size=10, block_size=4, n_layer=2, n_head=2, n_embd=8)


def _worker():
    mesh = init_device_mesh("cpu", SHAPE, mesh_dim_names=MESH_DIMS)
    gpt = GPT3D(GPT(CONFIG, rng=0).to(np.float64), mesh, "1f1b", microbatches=2)
    optimizer = optim.SGD(gpt.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    gpt.step(rng.integers(0, 10, (4, 4)), rng.integers(0, 10, (4, 4)), optimizer)
    dist.barrier()
    groups = {name: mesh.get_group(name).group_id for name in MESH_DIMS}
    if gpt.embedding_group is not None:
        groups["embedding"] = gpt.embedding_group.group_id
    return groups


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("mesh_timeline") / "gpt3d.jsonl"
    groups = minidist.launch(_worker, world_size=8, transport="shm", trace=str(path),
                             timeout=300)
    annotate_trace(path, trace_header(SHAPE, MESH_DIMS))
    dimension_of_group = {}
    for mine in groups:
        for name, group_id in mine.items():
            dimension_of_group[group_id] = "pp" if name == "embedding" else name
    return path, dimension_of_group


def test_a_message_runs_along_the_one_coordinate_its_ranks_differ_in():
    layout = mesh_layout((2, 3, 2))
    names = ("a", "b", "c")
    for rank in range(12):
        for peer in range(12):
            here, there = np.argwhere(layout == rank)[0], np.argwhere(layout == peer)[0]
            differ = np.flatnonzero(here != there)
            expected = names[differ[0]] if len(differ) == 1 else None
            assert timeline.message_dimension(rank, peer, (2, 3, 2), names) == expected


@pytest.mark.timeout(300)
def test_every_message_and_call_gets_the_dimension_of_its_group(run):
    path, dimension_of_group = run
    written = trace.read_jsonl(path)
    assert timeline.header_mesh(written.header) == (SHAPE, MESH_DIMS)
    events = list(written.events)
    found = timeline.event_dimensions(events, SHAPE, MESH_DIMS)
    checked = dict.fromkeys(MESH_DIMS, 0)
    for event, dimension in zip(events, found):
        if event["kind"] in ("send", "recv", "collective") \
                and event["group"] in dimension_of_group:
            assert dimension == dimension_of_group[event["group"]], event
            checked[dimension] += 1
    assert all(count > 0 for count in checked.values()), checked


@pytest.mark.timeout(300)
def test_bytes_per_dimension_add_up_the_sends_of_each_dimensions_groups(run):
    path, dimension_of_group = run
    # The messages of the mesh's groups: the ranks' agreement on the mesh and
    # the schedule goes over the whole world, whose messages run along a
    # coordinate only by chance of the ranks' places.
    events = [event for event in trace.read_jsonl(path).events
              if event["group"] in dimension_of_group]
    expected = dict.fromkeys(MESH_DIMS, 0)
    for event in events:
        if event["kind"] == "send":
            name = dimension_of_group[event["group"]]
            expected[name] = expected.get(name, 0) + event["bytes"]
    measured = timeline.bytes_per_dimension(events, mesh=(SHAPE, MESH_DIMS))
    assert {k: v for k, v in measured.items() if v} == {k: v for k, v in expected.items() if v}
    assert all(measured[name] > 0 for name in MESH_DIMS)


@pytest.mark.timeout(300)
def test_the_figure_colours_each_dimension_and_names_it_in_the_legend(run, tmp_path):
    path, _ = run
    figure = timeline.draw_timeline(path)     # "auto": the header names the mesh
    axis = figure.axes[0]
    legend = [text.get_text() for text in axis.get_legend().get_texts()]
    for name in MESH_DIMS:
        assert any(text.startswith(f"{name} (2 ranks)") for text in legend), legend
    faces = {to_hex(color) for collection in axis.collections
             for color in collection.get_facecolors()}
    assert {c.lower() for c in timeline.DIMENSION_COLORS[:3]} <= faces
    # Every colour drawn has its swatch, and the two-line legend is clear of the title.
    named = {to_hex(handle.get_facecolor()) for handle in axis.get_legend().legend_handles}
    assert faces <= named, faces - named
    assert text_problems(figure) == []
    plain = timeline.draw_timeline(path, color_by="lane").axes[0]
    assert "pp (2 ranks): messages, calls" not in [t.get_text() for t in plain.get_legend().get_texts()]
    timeline.save_timeline(path, tmp_path / "mesh.png")


def test_colour_by_mesh_needs_a_mesh():
    events = [{"rank": 0, "kind": "send", "peer": 1, "bytes": 8, "start": 0, "end": 1,
               "group": 0}]
    with pytest.raises(ValueError, match="names no device mesh"):
        timeline.draw_timeline(events, color_by="mesh")
    with pytest.raises(ValueError, match="choose 'lane', 'mesh' or 'auto'"):
        timeline.draw_timeline(events, color_by="rainbow")


def test_the_mesh_legend_counts_one_rank_and_names_the_step_span():
    """A dimension of one rank reads "1 rank"; the light grey of a step's
    region (the calls lane) has its own swatch, apart from the darker grey
    of a call in no one dimension."""
    events = [{"rank": 0, "kind": "step", "label": "pp2 step 0", "start": 0, "end": 10},
              {"rank": 0, "kind": "compute", "label": "F0", "start": 1, "end": 4},
              {"rank": 0, "kind": "send", "peer": 1, "bytes": 8, "start": 4, "end": 5,
               "group": 0},
              {"rank": 1, "kind": "recv", "peer": 0, "bytes": 8, "start": 4, "end": 6,
               "group": 0}]
    axis = timeline.draw_timeline(events, color_by="mesh",
                                  mesh=((2, 1, 1), ("pp", "dp", "tp"))).axes[0]
    legend = axis.get_legend()
    texts = [text.get_text() for text in legend.get_texts()]
    assert "pp (2 ranks): messages, calls" in texts and "dp (1 rank): messages, calls" in texts
    assert not any("1 ranks" in text for text in texts), texts
    swatch = {text.get_text(): to_hex(handle.get_facecolor())
              for text, handle in zip(legend.get_texts(), legend.legend_handles)}
    assert swatch["step / other span"] == timeline.COLORS["calls"].lower()
    assert swatch["step / other span"] != swatch["other group / world"]
