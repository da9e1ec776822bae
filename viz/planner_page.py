"""The 3D planner as one offline page: move a slider, see memory and time per rank.

Like the memory widget of the Ultra-Scale Playbook (Hugging Face, 2025),
with pipeline parallelism too: a student picks a GPT (layers, width, heads,
vocabulary, or a preset size), its batch (sequence length, global batch,
micro-batch), the mesh dp x tp x pp, how it runs (ZeRO's stage, sequence
parallelism, recomputation, the pipeline schedule and its virtual stages)
and the machine (memory, FLOP/s, the links within and between nodes, the
ranks of a node), and the page shows at once

* memory per rank (the fullest rank's): parameters, gradients, optimizer
  state and activations, stacked in a bar against the device's memory
  (red when they do not fit);
* a step's time: compute, TP's collectives, the pipeline's bubble, DP's
  gradient synchronisation, stacked in a bar;
* every dp x tp x pp of the same number of ranks (tp within a node), the
  fastest that fits highlighted, and a button that moves the sliders to it.

Where each number comes from: :func:`minidist.parallel.mesh.predict_step`
and :func:`minidist.parallel.mesh.compare_plans`, ported to JavaScript line
by line in ``viz/planner_page.js`` (each function there names its Python
original and keeps its order of operations). The pipeline's bubble is not a
closed form: the port runs the schedule on the virtual clock as
:func:`minidist.parallel.pipeline.simulate_schedule` does, whole nanoseconds
and all, so that a transfer between stages and interleaving count as they
do in Python. ``tests/viz/test_planner_page_browser.py`` loads the page in
Chromium and holds its numbers to the library's for a grid of settings.

What the page offers is what the planner models, no more:

* schedules: GPipe, 1F1B and interleaved 1F1B (the planner's; the
  zero-bubble schedules split the backward, which the planner's memory
  count does not follow yet);
* recomputation: none or full (``Plan.recompute``); selective
  recomputation is shown, greyed out: the planner does not count it;
* ZeRO's stages 0-3; FSDP is stage 3 in the planner's count (the same
  reduce_scatter and two all_gathers, the same shards);
* context and expert parallelism (cp, ep) are shown at 1, greyed out:
  their byte counts are in :mod:`minidist.parallel.context.costs` and
  :mod:`minidist.parallel.expert.costs`, but the 3D planner does not add
  them to a step yet, so neither does the page.

The machine: the links' alphas are :data:`minidist.parallel.mesh.CLUSTER`'s,
their bandwidths the sliders' (as ``minidist plan`` builds its machine); the
topology presets are :data:`MACHINES`, one today, a place for more. ::

    from viz.planner_page import write_page
    write_page("plan.html")                      # or: minidist plan --html plan.html
    write_page("plan.html", {"n_layer": 48, "dp": 16, "recompute": "full"})

Costs: writing the page, a few milliseconds (it is 45 kB); in the browser,
each change runs one prediction per factorisation of the ranks (38 for
1,024 ranks), each one pass of the virtual clock over its schedule's
actions, about 4 m p: some 20 ms a change at the start (6.7 B on 1,024
ranks), a few seconds at the sliders' far end (16,384 micro-batches on 128
stages), where a dragged slider redraws once it stops.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from minidist.alpha_beta import Params
from minidist.atomic_file import atomic_write
from minidist.parallel.mesh import CLUSTER, ZERO_COLLECTIVES, GPTShape, Machine, Plan

#: The schedules the page offers, as the planner names them.
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved_1f1b": "interleaved 1F1B"}
#: Recomputation as the planner knows it (``Plan.recompute``: full or none).
RECOMPUTE = {"none": "none", "full": "full (every block)"}
#: ZeRO's stages; stage 3 is FSDP in the planner's count.
ZERO_STAGES = {0: "0: DDP", 1: "1: optimizer state", 2: "2: + gradients",
               3: "3 / FSDP: + parameters"}

#: Where the page starts: ``minidist plan``'s defaults (a 6.7 B GPT on 1,024 ranks).
DEFAULTS = {
    "n_layer": 32, "n_embd": 4096, "n_head": 32, "vocab_size": 50304,
    "seq_len": 4096, "global_batch": 1024, "micro_batch": 1,
    "dp": 8, "tp": 8, "pp": 16,
    "schedule": "1f1b", "virtual_stages": 1, "sequence_parallel": False,
    "zero_stage": 0, "recompute": "none",
    "memory_gb": 80, "tflops": 400, "intra_gbs": 200, "inter_gbs": 25, "node_size": 8,
}

#: GPT sizes a student can start from (GPT-2's four, then the shapes of
#: 6.7 B, 13 B and 70 B models of the GPT-3 and Llama families).
MODELS = {
    "GPT-2 small (124 M)": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257},
    "GPT-2 medium (350 M)": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "vocab_size": 50257},
    "GPT-2 large (774 M)": {"n_layer": 36, "n_embd": 1280, "n_head": 20, "vocab_size": 50257},
    "GPT-2 XL (1.5 B)": {"n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50257},
    "6.7 B (minidist plan's)": {"n_layer": 32, "n_embd": 4096, "n_head": 32,
                                "vocab_size": 50304},
    "13 B": {"n_layer": 40, "n_embd": 5120, "n_head": 40, "vocab_size": 50304},
    "70 B shape": {"n_layer": 80, "n_embd": 8192, "n_head": 64, "vocab_size": 32000},
}

#: Topology presets: a machine's memory, FLOP/s, links and node. One today,
#: CLUSTER's constants (chosen, not measured); add a machine here and it is
#: in the page's list.
MACHINES = {
    "GPU cluster (minidist's CLUSTER)": {"memory_gb": 80, "tflops": 400, "intra_gbs": 200,
                                         "inter_gbs": 25, "node_size": 8},
}


def _topology_machines() -> dict:
    """The presets of :mod:`minidist.topology` as the planner sees them
    (``minidist plan --topology``: :func:`machine_of`): the intra link, and
    as the inter link a rank's share of its node's NICs. The page keeps
    CLUSTER's latencies (its alpha is one for every machine), so the preset
    sets the bandwidths and the node, as its label says."""
    from minidist.parallel.mesh.plan_command import machine_of
    from minidist.topology import PRESETS

    found = {}
    for name, make in PRESETS.items():
        topology = make(1)
        machine = machine_of(topology, 400e12)
        found[f"{name} nodes (minidist.topology; CLUSTER's latencies)"] = {
            "memory_gb": 80, "tflops": 400, "intra_gbs": round(1 / machine.intra.beta / 1e9, 6),
            "inter_gbs": round(1 / machine.inter.beta / 1e9, 6),
            "node_size": machine.node_size}
    return found


MACHINES.update(_topology_machines())


def _powers(low: int, high: int) -> list[int]:
    values, value = [], low
    while value <= high:
        values.append(value)
        value *= 2
    return values


#: Each slider's values (a slider's position is an index into its list; a
#: start value not among them is added in its place).
SLIDER_VALUES = {
    "n_layer": list(range(1, 129)),
    "n_embd": list(range(64, 16385, 64)),
    "n_head": list(range(1, 129)),
    "seq_len": _powers(64, 131072),
    "global_batch": _powers(1, 16384),
    "micro_batch": _powers(1, 64),
    "dp": _powers(1, 1024),
    "tp": _powers(1, 64),
    "pp": _powers(1, 128),
    "virtual_stages": list(range(1, 9)),
    "memory_gb": [8, 16, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 180, 192, 288],
    "tflops": list(range(10, 2001, 10)),
    "intra_gbs": [25, 50, 100, 150, 200, 300, 400, 450, 600, 900, 1800],
    "inter_gbs": [1, 3, 6, 12.5, 25, 50, 100, 200, 400],
    "node_size": [1, 2, 4, 8, 16, 32, 64, 72],
}
# Every machine preset's values are on its sliders (a preset moves the sliders).
for _preset in MACHINES.values():
    for _key, _value in _preset.items():
        if _key in SLIDER_VALUES and _value not in SLIDER_VALUES[_key]:
            SLIDER_VALUES[_key] = sorted(SLIDER_VALUES[_key] + [_value])

# --------------------------------------------------------------------------- settings


def settings_of(settings: dict | None = None) -> dict:
    """:data:`DEFAULTS` with ``settings`` over them; a name the page does not
    have is refused, naming the ones it has."""
    unknown = sorted(set(settings or {}) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"planner page: no setting {', '.join(map(repr, unknown))}; the page "
                         f"has {', '.join(DEFAULTS)}")
    merged = {**DEFAULTS, **(settings or {})}
    if merged["schedule"] not in SCHEDULES:
        raise ValueError(f"planner page: schedule {merged['schedule']!r} is not one the page "
                         f"offers; choose one of {', '.join(SCHEDULES)}")
    if merged["recompute"] not in RECOMPUTE:
        raise ValueError(f"planner page: recompute {merged['recompute']!r}; choose one of "
                         f"{', '.join(RECOMPUTE)} (the planner counts no selective "
                         "recomputation)")
    if merged["zero_stage"] not in ZERO_STAGES:
        raise ValueError(f"planner page: zero_stage must be 0, 1, 2 or 3, got "
                         f"{merged['zero_stage']!r}")
    return merged


def shape_of(settings: dict) -> GPTShape:
    """The :class:`~minidist.parallel.mesh.GPTShape` the page's settings describe."""
    s = settings_of(settings)
    return GPTShape(s["n_layer"], s["n_embd"], s["n_head"], s["vocab_size"], s["seq_len"],
                    s["global_batch"], s["micro_batch"])


def plan_of(settings: dict) -> Plan:
    """The :class:`~minidist.parallel.mesh.Plan` of the page's settings (the
    virtual stages count only with the interleaved schedule, as the page
    greys its slider out otherwise)."""
    s = settings_of(settings)
    return Plan(s["dp"], s["tp"], s["pp"], **options_of(s))


def options_of(settings: dict) -> dict:
    """The plan's options without the mesh: what ``compare_plans`` gives every plan."""
    s = settings_of(settings)
    return {"schedule": s["schedule"],
            "virtual_stages": s["virtual_stages"] if s["schedule"] == "interleaved_1f1b" else 1,
            "sequence_parallel": bool(s["sequence_parallel"]), "zero_stage": s["zero_stage"],
            "recompute": s["recompute"] == "full"}


def machine_of(settings: dict) -> Machine:
    """The :class:`~minidist.parallel.mesh.Machine`: CLUSTER's alphas, the
    settings' bandwidths (GB/s, 10^9 bytes), FLOP/s and node."""
    s = settings_of(settings)
    return Machine(flops=s["tflops"] * 1e12,
                   intra=Params(CLUSTER.intra.alpha, 1 / (s["intra_gbs"] * 1e9)),
                   inter=Params(CLUSTER.inter.alpha, 1 / (s["inter_gbs"] * 1e9)),
                   node_size=s["node_size"])


def memory_limit_of(settings: dict) -> float:
    """A device's memory in bytes (GB: 10^9 bytes)."""
    return settings_of(settings)["memory_gb"] * 1e9


# --------------------------------------------------------------------------- the page

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
.planner { display: grid; grid-template-columns: 370px 1fr; gap: 18px; padding: 14px; }
h1 { font-size: 20px; margin: 12px 14px 0; } p.intro { margin: 4px 14px; max-width: 70em; }
fieldset { border: 1px solid #ccc; border-radius: 6px; margin: 0 0 10px; padding: 6px 10px; }
legend { font-weight: 600; } label { display: grid; grid-template-columns: 9em 1fr 4em;
  align-items: center; gap: 6px; margin: 3px 0; } label.off { color: #999; }
output { font-variant-numeric: tabular-nums; text-align: right; }
select, input[type=number] { width: 100%; }
.bar { position: relative; display: flex; height: 28px; border: 1px solid #888;
  background: #fff; margin: 6px 0; } .bar > span { height: 100%; }
.bar.over { border: 2px solid #c00; background: #fdd; }
#memory-limit-line { position: absolute; top: -4px; bottom: -4px; width: 2px; background: #000; }
[data-part=parameters], .key-parameters { background: #4e79a7; }
[data-part=gradients], .key-gradients { background: #f28e2b; }
[data-part=optimizer_state], .key-optimizer_state { background: #76b7b2; }
[data-part=activations], .key-activations { background: #e15759; }
[data-part=compute], .key-compute { background: #59a14f; }
[data-part=tp_comm], .key-tp_comm { background: #edc948; }
[data-part=pp_bubble], .key-pp_bubble { background: #bab0ac; }
[data-part=dp_comm], .key-dp_comm { background: #b07aa1; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
td, th { padding: 2px 8px; text-align: right; border-bottom: 1px solid #eee; }
td:first-child, th:first-child { text-align: left; }
.key { display: inline-block; width: 12px; height: 12px; margin-right: 4px; }
tr.best { background: #d9f2d9; font-weight: 600; } tr.current td:first-child::before { content: "> "; }
tr.over { color: #a00; } #fits[data-fits=false] { color: #c00; font-weight: 600; }
#why { color: #c00; font-weight: 600; } .planner[data-state=impossible] .numbers { opacity: .35; }
pre { font-size: 12px; white-space: pre-wrap; } .note { color: #666; font-size: 12px; }
"""

_MEMORY_ROWS = (("parameters", "parameters (fp32 weights)"), ("gradients", "gradients"),
                ("optimizer_state", "optimizer state (Adam's two moments)"),
                ("activations", "activations (at the schedule's peak)"))
_TIME_ROWS = (("compute", "compute (forwards, backwards, recomputations)"),
              ("tp_comm", "TP collectives (on the critical path)"),
              ("pp_bubble", "PP bubble (fill, drain, waits on messages)"),
              ("dp_comm", "DP gradient synchronisation (ZeRO's collectives)"))


def _slider(setting: str, label: str, start) -> str:
    values = list(SLIDER_VALUES[setting])
    if start not in values:
        values = sorted(values + [start])
    return (f'<label>{html.escape(label)}<input type="range" id="{setting}" '
            f'data-setting="{setting}" min="0" max="{len(values) - 1}" step="1" '
            f'value="{values.index(start)}" data-values="{html.escape(json.dumps(values))}">'
            f'<output for="{setting}">{start}</output></label>')


def _select(setting: str, label: str, options: dict, start, extra: str = "") -> str:
    kind = ' data-kind="int"' if all(isinstance(key, int) for key in options) else ""
    choices = "".join(f'<option value="{key}"{" selected" if key == start else ""}>'
                      f"{html.escape(text)}</option>" for key, text in options.items())
    return (f'<label>{html.escape(label)}<select id="{setting}" data-setting="{setting}"{kind}>'
            f"{choices}{extra}</select><span></span></label>")


def _presets(ident: str, label: str, names) -> str:
    choices = "".join(f'<option value="{html.escape(n)}">{html.escape(n)}</option>'
                      for n in names)
    return (f'<label>{label}<select id="{ident}"><option value="">(keep the sliders)</option>'
            f"{choices}</select><span></span></label>")


def _off(label: str, why: str) -> str:
    """A control the planner does not model yet: shown at 1, greyed out, with why."""
    return (f'<label class="off" title="{html.escape(why)}">{html.escape(label)}'
            f'<input type="range" min="0" max="0" value="0" disabled><output>1</output></label>')


def _rows(prefix: str, rows) -> str:
    return "".join(f'<tr><td><span class="key key-{name}"></span>{html.escape(text)}</td>'
                   f'<td id="{prefix}-{name}"></td></tr>' for name, text in rows)


def planner_html(settings: dict | None = None) -> str:
    """The whole page: controls set to ``settings`` (over :data:`DEFAULTS`),
    its script and styles inline, no address outside it."""
    s = settings_of(settings)
    config = {"itemsize": 2, "alpha": {"intra": CLUSTER.intra.alpha, "inter": CLUSTER.inter.alpha},
              "zero_collectives": {str(k): list(v) for k, v in ZERO_COLLECTIVES.items()},
              "presets": {"models": MODELS, "machines": MACHINES}}
    script = Path(__file__).with_name("planner_page.js").read_text(encoding="utf-8")
    not_modelled = ("the 3D planner does not add context or expert parallelism to a step yet "
                    "(their bytes: minidist/parallel/context/costs.py, expert/costs.py)")
    controls = "".join([
        "<fieldset><legend>Model</legend>",
        _presets("model-preset", "preset", MODELS),
        _slider("n_layer", "layers L", s["n_layer"]),
        _slider("n_embd", "width h", s["n_embd"]),
        _slider("n_head", "heads a", s["n_head"]),
        f'<label>vocabulary V<input type="number" id="vocab_size" data-setting="vocab_size" '
        f'data-kind="int" min="1" step="1" value="{s["vocab_size"]}"><span></span></label>',
        "</fieldset><fieldset><legend>Batch</legend>",
        _slider("seq_len", "sequence length s", s["seq_len"]),
        _slider("global_batch", "global batch B", s["global_batch"]),
        _slider("micro_batch", "micro-batch b", s["micro_batch"]),
        "</fieldset><fieldset><legend>Mesh</legend>",
        _slider("dp", "data parallel dp", s["dp"]),
        _slider("tp", "tensor parallel tp", s["tp"]),
        _slider("pp", "pipeline stages pp", s["pp"]),
        _off("context parallel cp", not_modelled),
        _off("expert parallel ep", not_modelled),
        "</fieldset><fieldset><legend>How it runs</legend>",
        _select("zero_stage", "ZeRO stage", ZERO_STAGES, s["zero_stage"]),
        f'<label>sequence parallel<input type="checkbox" id="sequence_parallel" '
        f'data-setting="sequence_parallel"{" checked" if s["sequence_parallel"] else ""}>'
        "<span></span></label>",
        _select("recompute", "recomputation", RECOMPUTE, s["recompute"],
                '<option value="selective" disabled>selective (not modelled)</option>'),
        _select("schedule", "pipeline schedule", SCHEDULES, s["schedule"]),
        _slider("virtual_stages", "virtual stages v", s["virtual_stages"]),
        "</fieldset><fieldset><legend>Machine</legend>",
        _presets("machine-preset", "preset", MACHINES),
        _slider("memory_gb", "device memory GB", s["memory_gb"]),
        _slider("tflops", "TFLOP/s a rank", s["tflops"]),
        _slider("intra_gbs", "within a node GB/s", s["intra_gbs"]),
        _slider("inter_gbs", "between nodes GB/s", s["inter_gbs"]),
        _slider("node_size", "ranks a node", s["node_size"]),
        "</fieldset>",
    ])
    intro = ("A GPT's training step on a dp x tp x pp mesh, predicted by minidist's 3D planner "
             "(<code>predict_step</code>): move a slider and the memory of the fullest rank and "
             "the step's time follow; below, every mesh of the same ranks, the fastest that fits "
             "highlighted (<code>compare_plans</code>). After the memory widget of the "
             "Ultra-Scale Playbook (Hugging Face, 2025), with pipeline parallelism: the bubble "
             "comes from the schedule run on the planner's virtual clock.")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>minidist: the 3D planner</title>
<style>{_STYLE}</style></head><body>
<h1>minidist: the 3D planner</h1><p class="intro">{intro}</p>
<div class="planner" data-state="predicted"><div class="controls">{controls}</div>
<div class="results"><p id="summary"></p><p id="why"></p><div class="numbers">
<h2>Memory per rank <span id="fits"></span></h2>
<div class="bar" id="memory-bar">{"".join(f'<span data-part="{n}"></span>' for n, _ in _MEMORY_ROWS)}
<div id="memory-limit-line" title="the device's memory"></div></div>
<table>{_rows("memory", _MEMORY_ROWS)}
<tr><th>total (the fullest rank)</th><th id="memory-total"></th></tr>
<tr><td>device memory</td><td id="memory-limit"></td></tr></table>
<p class="note">16 bytes a parameter (fp32 weights, gradients, Adam's two moments), sharded
over dp by ZeRO's stage; activations: the course's count of what a block keeps for its
backward (minidist/memory.py), times the layers of a stage and the micro-batches the schedule
holds at its peak.</p>
<h2>A step's time</h2>
<div class="bar" id="time-bar">{"".join(f'<span data-part="{n}"></span>' for n, _ in _TIME_ROWS)}</div>
<table>{_rows("time", _TIME_ROWS)}
<tr><td>CP, EP</td><td id="time-cp_ep" title="{html.escape(not_modelled)}">not modelled</td></tr>
<tr><th>step</th><th id="time-total"></th></tr></table>
<pre id="collectives"></pre></div>
<h2>Every dp x tp x pp of these ranks</h2>
<p>fastest that fits: <strong id="best-plan"></strong>
<button id="use-best" type="button">use it</button></p>
<table><thead><tr><th>plan</th><th>step</th><th>compute</th><th>tp comm</th><th>pp bubble</th>
<th>dp comm</th><th>a rank</th><th></th></tr></thead><tbody id="plans"></tbody></table>
<pre id="impossible"></pre></div></div>
<script type="application/json" id="planner-config">{_json_in_html(config)}</script>
<script>{script}</script>
</body></html>
"""
    return page


def _json_in_html(value) -> str:
    """JSON safe inside a <script> element: no "</" can close it."""
    return json.dumps(value).replace("</", "<\\/")


def write_page(path, settings: dict | None = None) -> Path:
    """Write :func:`planner_html` to ``path`` (atomically) and return the path."""
    page = planner_html(settings)
    with atomic_write(path) as file:
        file.write(page)
    return Path(path)
