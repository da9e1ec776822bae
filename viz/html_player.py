"""A replay player for the browser: one HTML file that needs no network.

The page holds everything it shows: the frames as data (JSON), drawn as SVG
by a small script in the page, and buttons whose labels are plain text, so
it works offline, from a USB stick, in a notebook. It steps through the same
frames as the terminal and the GIF (:mod:`viz.replay`): step 0 is the state
before any message, step K the end of the call, and the label says "step k
of K" as they do.

Controls: first / back / play-pause / forward / last, a slider, and the
keys (left and right arrows step back and forward, Home and End go to the
first and last step, space plays and pauses). "Follow rank" highlights one
rank in every frame: its buffer framed, the other ranks and the messages it
neither sends nor receives faded, and a line saying what it sends and
receives in the step. Under the picture a legend names every symbol and
colour the cells show, the GIF's legend (:func:`viz.animate.legend_entries`)
in the terminal's words.

Why drawn from data rather than images: highlighting a rank is then a
class on some SVG elements, not one picture per rank and step, and the
page stays small: a ring all_reduce on 4 ranks is 28 kB, on 8 ranks 92 kB,
on 16 ranks 0.5 MB (one picture per rank and step of the 8-rank ring, as
PNGs, would be megabytes). The places of everything (cells, arrows, labels, titles)
come from the matplotlib painter of :mod:`viz.animate`
(:func:`viz.animate.player_panel`), so the page and the GIF agree. The
summary view (above 16 ranks) is a set of charts, so there the frames are
the painter's PNG images and there is no rank to follow.

    from viz.animate import player_panel
    from viz.html_player import save_player
    save_player("ring.html", "all_reduce ring", [player_panel(replay)])

Several panels step together (the exercise replay: the student's run beside
the reference's); ``notes`` adds a line to chosen steps ("first difference").
"""

from __future__ import annotations

import html
import itertools
import json
import os

from minidist.atomic_file import atomic_write

#: Frames a second when playing.
FPS = 1.0
_counter = itertools.count()


# --------------------------------------------------------------------------- the page


def _rounded(value):
    """Floats to 4 decimals (a ten-thousandth of a ring's radius: far below a
    pixel), which keeps the page small."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(item) for item in value]
    return value


def player_html(title: str, panels: list[dict], *, notes: dict[int, str] | None = None,
                start: int = 0, fps: float = FPS, intro: str = "",
                standalone: bool = True) -> str:
    """The player as HTML: a whole page, or (``standalone=False``) a fragment
    to embed in a notebook, whose keys work while it has the focus.

    ``panels``: from :func:`viz.animate.player_panel`; a panel with fewer steps than the
    others shows "(no more steps)" past its end. ``notes``: step -> a line
    shown at that step. ``start``: the step shown first."""
    if not panels:
        raise ValueError("a player needs at least one panel to show")
    if fps <= 0:
        raise ValueError(f"fps must be a positive number of frames a second, got {fps}")
    steps = max(len(panel["steps"]) for panel in panels)
    start = max(0, min(int(start), steps - 1))
    data = {"panels": panels, "notes": {str(k): v for k, v in (notes or {}).items()},
            "start": start, "interval": 1000.0 / fps, "standalone": standalone}
    # "</" cannot end the script early: JSON lets it be written "<\/".
    payload = json.dumps(_rounded(data), separators=(",", ":")).replace("</", "<\\/")
    ranks = max(panel["world"] for panel in panels)
    follow = any(panel["follow"] for panel in panels)
    options = "".join(f'<option value="{rank}">rank {rank}</option>' for rank in range(ranks))
    why_not = "" if follow else " disabled title=\"the summary view has no cells to follow\""
    box = f"player{next(_counter)}"
    body = f"""<div class="minidist-player" id="{box}" tabindex="0">
<h1>{html.escape(title)}</h1>
{f'<p class="intro">{html.escape(intro)}</p>' if intro else ""}
<div class="controls">
<button data-do="first" title="first step (Home)">|&lt; first</button>
<button data-do="back" title="one step back (left arrow)">&lt; back</button>
<button data-do="play" title="play / pause (space)">play</button>
<button data-do="forward" title="one step forward (right arrow)">forward &gt;</button>
<button data-do="last" title="last step (End)">last &gt;|</button>
<input class="slider" type="range" min="0" max="{steps - 1}" value="{start}"
 aria-label="step">
<span class="where" aria-live="polite"></span>
<label>follow <select class="follow"{why_not}><option value="">no rank</option>{options}</select></label>
</div>
<p class="keys">keys: &larr; / &rarr; step, Home / End first / last, space play / pause</p>
<p class="note"></p>
<div class="panels"></div>
</div>
<style>{_STYLE.replace("BOX", "#" + box)}</style>
<script>(function () {{
const data = {payload};
const root = document.getElementById("{box}");
{_SCRIPT}
}})();</script>"""
    if not standalone:
        return body
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(title)}</title>
</head><body>
{body}
</body></html>
"""


def save_player(path, title: str, panels: list[dict], **options) -> str:
    """Write :func:`player_html` to ``path``; returns the path."""
    path = os.fspath(path)
    page = player_html(title, panels, **options)
    with atomic_write(path) as file:
        file.write(page)
    return path


_STYLE = """
BOX { font-family: sans-serif; color: #1b1b1b; max-width: 1400px; outline: none; }
BOX h1 { font-size: 1.2em; margin: 0.3em 0; }
BOX .controls { display: flex; flex-wrap: wrap; gap: 0.4em; align-items: center; }
BOX .controls button { font: inherit; padding: 0.2em 0.7em; min-width: 5.5em; }
BOX .slider { width: 16em; }
BOX .where { font-weight: bold; min-width: 16em; }
BOX .keys { color: #595959; font-size: 0.85em; margin: 0.2em 0; }
BOX .note { font-weight: bold; margin: 0.3em 0; min-height: 1.2em; }
BOX .note.marked { background: #FFBC79; padding: 0.2em; }
BOX .panels { display: flex; flex-wrap: wrap; gap: 1.5em; }
BOX .panel { flex: 1 1 560px; min-width: 0; }
BOX .panel h2 { font-size: 1em; margin: 0.4em 0; }
BOX .header { margin: 0; font-size: 0.85em; white-space: pre-wrap; }
BOX .header:first-child { font-weight: bold; }
BOX svg { width: 100%; height: auto; max-height: 70vh; display: block; }
BOX svg text { font-family: sans-serif; }
BOX .rank-line { min-height: 1.2em; font-size: 0.9em; }
BOX .messages { font-family: monospace; font-size: 0.85em; margin: 0; white-space: pre; }
BOX .messages .mine { font-weight: bold; background: #FFF2B0; }
BOX .legend span.swatch { display: inline-block; width: 0.9em; height: 0.9em;
  border: 1px solid #777; vertical-align: middle; margin: 0 0.3em 0 0; }
BOX .legend { font-size: 0.85em; display: flex; flex-wrap: wrap; gap: 0.2em 0.9em; }
BOX .legend .entry { white-space: nowrap; }
BOX .legend .arrow { font-weight: bold; margin: 0 0.3em 0 0; }
BOX .bar { position: relative; height: 0.7em; background: #eee; margin: 0.3em 0; }
BOX .bar .so-far { position: absolute; left: 0; top: 0; bottom: 0; background: #006BA4; }
BOX .bar .mark { position: absolute; top: -0.2em; bottom: -0.2em; width: 2px; }
BOX .following .rank:not(.mine), BOX .following .msg:not(.mine) { opacity: 0.18; }
BOX .rank .frame { display: none; }
BOX .rank.mine .frame { display: inline; }
BOX img { max-width: 100%; }
"""

# The script is the same for every page; the data differs.
_SCRIPT = r"""
const panels = data.panels;
const steps = Math.max(...panels.map(p => p.steps.length));
const slider = root.querySelector(".slider");
const where = root.querySelector(".where");
const follow = root.querySelector(".follow");
const note = root.querySelector(".note");
const playButton = root.querySelector('[data-do="play"]');
const area = root.querySelector(".panels");
let at = data.start, timer = null;

const esc = s => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
  .replace(/"/g, "&quot;");
const anchor = {center: "middle", left: "start", right: "end"};
const baseline = {center: "central", bottom: "text-after-edge", top: "text-before-edge"};

// One panel's frame as SVG (y flipped: the scene's y points up).
function svgOf(scene, palette) {
  const [x0, x1, y0, y1] = scene.view, f = scene.font, s = scene.size;
  const out = [`<svg viewBox="${x0} ${-y1} ${x1 - x0} ${y1 - y0}" role="img">`];
  out.push("<defs>" + palette.map((c, i) => `<marker id="${root.id}-a${i}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="4" markerHeight="4" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="${c}"/></marker>`).join("") + "</defs>");
  if (scene.ring) out.push(`<ellipse cx="0" cy="0" rx="${scene.ring[0]}" ry="${scene.ring[1]}" fill="none" stroke="#E5E5E5" stroke-width="${s * 0.03}"/>`);
  for (const [ax, ay, bx, by] of scene.edges) out.push(`<line x1="${ax}" y1="${-ay}" x2="${bx}" y2="${-by}" stroke="#DDDDDD" stroke-width="${s * 0.03}"/>`);
  for (const r of scene.ranks) {
    out.push(`<g class="rank" data-rank="${r.rank}">`);
    const cells = r.cells || [];
    const xs = cells.map(c => c[0]), ys = cells.map(c => c[1]);
    const left = r.box ? r.box[0] : Math.min(...xs), bottom = r.box ? r.box[1] : Math.min(...ys);
    const right = r.box ? r.box[0] + r.box[2] : Math.max(...xs) + s;
    const top = r.box ? r.box[1] + r.box[3] : Math.max(...ys) + s;
    const pad = s * 0.12;
    out.push(`<rect class="frame" x="${left - pad}" y="${-top - pad}" width="${right - left + 2 * pad}" height="${top - bottom + 2 * pad}" fill="#FFF2B0" stroke="#000" stroke-width="${s * 0.06}"/>`);
    const [tx, ty, ha, va] = r.title;
    out.push(`<text x="${tx}" y="${-ty}" font-size="${f}" font-weight="bold" text-anchor="${anchor[ha]}" dominant-baseline="${baseline[va]}">rank ${r.rank}</text>`);
    if (r.box) {
      const [bx, by, w, h, fill, ink] = r.box;
      out.push(`<rect x="${bx}" y="${-by - h}" width="${w}" height="${h}" rx="${s * 0.05}" fill="${fill}" stroke="#000" stroke-width="${s * 0.02}"/>`);
      out.push(`<text x="${bx + w / 2}" y="${-by - h / 2}" font-size="${f}" fill="${ink}" text-anchor="middle" dominant-baseline="central">${r.rank}</text>`);
    }
    cells.forEach(([cx, cy, fill, text, ink, outlined], i) => {
      out.push(`<rect class="cell" data-rank="${r.rank}" data-cell="${i}" data-text="${esc(text)}" x="${cx}" y="${-cy - s}" width="${s}" height="${s}" fill="${fill}" stroke="${outlined ? "#000" : "#777"}" stroke-width="${s * (outlined ? 0.07 : 0.02)}"/>`);
      out.push(`<text x="${cx + s / 2}" y="${-cy - s / 2}" font-size="${f * (text.length > 1 ? 0.8 : 1)}" fill="${ink}" text-anchor="middle" dominant-baseline="central">${esc(text)}</text>`);
    });
    out.push("</g>");
  }
  for (const m of scene.messages) {
    const [sx, sy, cx, cy, ex, ey] = m.path;
    const colour = palette.indexOf(m.color);
    out.push(`<g class="msg" data-source="${m.source}" data-target="${m.target}"><path d="M${sx},${-sy} Q${cx},${-cy} ${ex},${-ey}" fill="none" stroke="${m.color}" stroke-width="${s * 0.06}" marker-end="url(#${root.id}-a${colour})"/>`);
    if (m.label) out.push(`<text x="${m.label[0]}" y="${-m.label[1]}" font-size="${f * 0.75}" text-anchor="middle" dominant-baseline="central" stroke="#fff" stroke-width="${f * 0.25}" paint-order="stroke" fill="#1b1b1b">${esc(m.label[2])}</text>`);
    out.push("</g>");
  }
  out.push("</svg>");
  return out.join("");
}

// The cells' legend: the entries of viz.animate.legend_entries, the GIF's own.
function legend(panel) {
  const items = (panel.legend || []).map(e => `<span class="entry" data-symbol="${esc(e.symbol)}">`
    + (e.line ? `<span class="arrow" style="color:${e.fill}">&#x2192;</span>`
       : `<span class="swatch" style="background:${e.fill};border-color:${e.edge};border-width:${Math.max(1, Math.round(e.width))}px"></span>`)
    + `${esc(e.label)}${e.note ? " " + esc(e.note) : ""}</span>`);
  return items.length ? "<b>cells</b> " + items.join("") : "";
}

// What the followed rank does in a step, in words.
function rankLine(rank, messages) {
  if (rank === "") return "";
  const r = +rank;
  const sends = messages.filter(m => m[0] === r), receives = messages.filter(m => m[1] === r);
  const words = [];
  if (sends.length) words.push("sends to " + sends.map(m => m[1]).join(", "));
  if (receives.length) words.push("receives from " + receives.map(m => m[0]).join(", "));
  return `rank ${r} in this step: ` + (words.length ? words.join("; ") : "sends and receives nothing");
}

function show(step) {
  at = Math.max(0, Math.min(steps - 1, step));
  slider.value = at;
  where.textContent = `step ${at} of ${steps - 1}` + (at === 0 ? " (before any message)" : "");
  const text = data.notes[String(at)] || "";
  note.textContent = text;
  note.classList.toggle("marked", text !== "");
  const rank = follow.value;
  area.innerHTML = panels.map((panel, p) => {
    const frame = panel.steps[at];
    const head = panel.caption ? `<h2>${esc(panel.caption)}</h2>` : "";
    if (!frame) return `<div class="panel" data-panel="${p}">${head}<p>(no more steps)</p></div>`;
    const lines = frame.header.map(line => `<p class="header">${esc(line)}</p>`).join("");
    const picture = frame.scene ? svgOf(frame.scene, panel.palette)
      : `<img alt="step ${at}" src="${frame.image}">`;
    const bar = `<div class="bar" title="time so far ${esc(frame.elapsed_text)}"><div class="so-far" style="width:${100 * frame.elapsed}%"></div>`
      + `<div class="mark" style="left:${100 * panel.measured}%;background:#595959"></div>`
      + (panel.predicted === null ? "" : `<div class="mark" style="left:${100 * panel.predicted}%;background:#FF800E"></div>`)
      + "</div>";
    const messages = frame.messages.map(m => {
      const mine = rank !== "" && (m[0] === +rank || m[1] === +rank);
      return `<span class="${mine ? "mine" : ""}">${esc(m[2])}</span>`;
    }).join("\n") || (at === 0 ? "(none yet: each rank holds its own data)" : "(no messages in this step)");
    return `<div class="panel" data-panel="${p}">${head}${lines}${bar}${picture}`
      + `<p class="rank-line">${esc(frame.scene ? rankLine(rank, frame.messages) : "")}</p>`
      + `<p class="legend">${frame.scene ? legend(panel) : ""}</p>`
      + `<p><b>messages of this step (${frame.messages.length})</b></p><pre class="messages">${messages}</pre></div>`;
  }).join("");
  for (const svg of area.querySelectorAll("svg")) {
    svg.classList.toggle("following", rank !== "");
    if (rank === "") continue;
    for (const g of svg.querySelectorAll(".rank")) g.classList.toggle("mine", g.dataset.rank === rank);
    for (const g of svg.querySelectorAll(".msg"))
      g.classList.toggle("mine", g.dataset.source === rank || g.dataset.target === rank);
  }
  root.dataset.step = at;
}

function pause() {
  if (timer !== null) clearInterval(timer);
  timer = null;
  playButton.textContent = "play";
}

function play() {
  if (timer !== null) return pause();
  if (at === steps - 1) show(0);
  playButton.textContent = "pause";
  timer = setInterval(() => { if (at >= steps - 1) pause(); else show(at + 1); }, data.interval);
}

const actions = {first: () => { pause(); show(0); }, back: () => { pause(); show(at - 1); },
                 play: play, forward: () => { pause(); show(at + 1); },
                 last: () => { pause(); show(steps - 1); }};
for (const button of root.querySelectorAll("button[data-do]"))
  button.addEventListener("click", () => actions[button.dataset.do]());
slider.addEventListener("input", () => { pause(); show(+slider.value); });
follow.addEventListener("change", () => show(at));

const keys = {ArrowLeft: "back", ArrowRight: "forward", Home: "first", End: "last", " ": "play"};
function onKey(event) {
  const action = keys[event.key];
  if (!action || event.altKey || event.ctrlKey || event.metaKey) return;
  // The slider and the select move with the arrows themselves.
  const tag = event.target.tagName;
  if ((tag === "INPUT" || tag === "SELECT") && action !== "play") return;
  event.preventDefault();  // no scrolling, no second click of a focused button
  actions[action]();
}
// A page answers keys anywhere; a player inside a notebook only while it has the focus.
(data.standalone ? document : root).addEventListener("keydown", onKey);
root.addEventListener("keyup", event => { if (event.key === " ") event.preventDefault(); });
show(at);
"""
