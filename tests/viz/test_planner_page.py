"""The planner page's generator, without a browser: the page is one
self-contained file (no address outside it), it starts where it is told,
``minidist plan --html`` writes it, and a setting it does not have is
refused by name. What the page computes is held in a real browser by
``test_planner_page_browser.py``."""

from __future__ import annotations

import html
import json
import re

import pytest

from minidist import cli
from minidist.parallel.mesh import compare_plans
from viz.planner_page import (
    DEFAULTS,
    MACHINES,
    MODELS,
    SLIDER_VALUES,
    machine_of,
    memory_limit_of,
    options_of,
    planner_html,
    settings_of,
    shape_of,
    write_page,
)


def _slider_value(page: str, setting: str):
    """The value a slider starts on: its position in its list of values."""
    tag = re.search(rf'<input type="range" id="{setting}"[^>]*>', page).group(0)
    values = json.loads(html.unescape(re.search(r'data-values="([^"]*)"', tag).group(1)))
    return values[int(re.search(r'value="(\d+)"', tag).group(1))]


def test_the_page_is_one_self_contained_file():
    page = planner_html()
    # Nothing is fetched: no src or href at all, no stylesheet link, no import or url() in CSS.
    assert not re.search(r"\b(?:src|href)\s*=", page, re.IGNORECASE)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert not re.search(r"https?://", page), re.findall(r"https?://\S+", page)
    # The script and its data are inline, and the data is valid JSON.
    assert page.count("<script") == 2 and "planner.predictStep" not in page[:page.find("<script")]
    config = re.search(r'<script type="application/json" id="planner-config">(.*?)</script>',
                       page, re.DOTALL).group(1)
    assert set(json.loads(config)["presets"]["models"]) == set(MODELS)
    assert set(json.loads(config)["presets"]["machines"]) == set(MACHINES)


def test_the_page_starts_on_its_settings_and_adds_a_value_a_slider_lacks():
    page = planner_html({"dp": 4, "n_layer": 48, "memory_gb": 85.9})
    assert _slider_value(page, "dp") == 4 and _slider_value(page, "n_layer") == 48
    assert _slider_value(page, "memory_gb") == 85.9      # not among the slider's, added
    assert 85.9 not in SLIDER_VALUES["memory_gb"]
    assert _slider_value(planner_html(), "pp") == DEFAULTS["pp"]


@pytest.mark.parametrize("settings, words", [
    ({"cp": 2}, "no setting 'cp'; the page has n_layer"),
    ({"recompute": "selective"}, "the planner counts no selective recomputation"),
    ({"schedule": "zb_h1"}, "choose one of 1f1b, gpipe, interleaved_1f1b"),
    ({"zero_stage": 4}, "zero_stage must be 0, 1, 2 or 3"),
])
def test_a_setting_the_page_does_not_have_is_refused_by_name(settings, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        settings_of(settings)


def test_minidist_plan_html_writes_the_page_on_the_fastest_plan(tmp_path, capsys):
    model = ["--n-layer", "8", "--n-embd", "512", "--n-head", "8", "--seq-len", "512",
             "--global-batch", "32"]
    path = tmp_path / "plan.html"
    assert cli.main(["plan", "--html", str(path), "--ranks", "16", "--memory", "2GB",
                     "--zero-stage", "1", *model]) == 0
    assert str(path) in capsys.readouterr().out
    page = path.read_text()
    settings = {name: _slider_value(page, name) for name in ("dp", "tp", "pp", "memory_gb")}
    start = settings_of({"n_layer": 8, "n_embd": 512, "n_head": 8, "seq_len": 512,
                         "global_batch": 32, "memory_gb": 2.0, "zero_stage": 1})
    best = compare_plans(shape_of(start), 16, machine_of(start), memory_limit_of(start),
                         **options_of(start)).best.plan
    assert (settings["dp"], settings["tp"], settings["pp"]) == (best.dp, best.tp, best.pp)
    assert settings["memory_gb"] == 2.0
    assert 'id="zero_stage" data-setting="zero_stage" data-kind="int"><option value="0">' \
           '0: DDP</option><option value="1" selected>' in page
    # A mistake in the arguments is the command's one line and status 2, and no page.
    for mistake in (["--mesh", "2x3x2"], ["--n-head", "7"]):
        assert cli.main(["plan", "--html", str(tmp_path / "no.html"), *model, *mistake]) == 2
        assert "minidist plan:" in capsys.readouterr().err
    assert not (tmp_path / "no.html").exists()


def test_write_page_writes_what_planner_html_gives(tmp_path):
    path = write_page(tmp_path / "page.html", {"tp": 4})
    assert path.read_text() == planner_html({"tp": 4})
