"""The HTML player in a real headless browser (Debian's Chromium, driven by
Playwright): it loads with the network off, every control works, and the
pictures of step 0 and step 3 differ where the frame model says they do.

Playwright drives the system's Chromium (``executable_path``); it downloads
no browser. Without Playwright or Chromium the tests skip and say which is
missing (.ci/run installs Chromium, ``pip install -e '.[dev]'`` Playwright).
"""

from __future__ import annotations

import io
import os
import shutil

import numpy as np
import pytest
import viz_samples
from legends import unnamed
from PIL import Image

from viz import animate
from viz.exercise_replay import Pair, SideBySide, save_side_by_side_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _missing(why: str):
    """Skip, saying why; where the browser is required (.ci/run), fail."""
    if os.environ.get("MINIDIST_REQUIRE_BROWSER"):
        pytest.fail(f"{why} (MINIDIST_REQUIRE_BROWSER is set: .ci/run installs it)")
    pytest.skip(why)


def _chromium() -> str | None:
    named = os.environ.get("MINIDIST_CHROMIUM")
    return named or next((path for path in map(shutil.which, BROWSERS) if path), None)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        _missing("Playwright is not installed: pip install -e '.[dev]' (it drives the "
                 "system's Chromium)")
    path = _chromium()
    if path is None:
        _missing("no Chromium on this machine: apt-get install chromium (Debian), or set "
                 "MINIDIST_CHROMIUM to a Chromium or Chrome executable")
    with sync_playwright() as playwright:
        try:
            # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
            launched = playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
        except Error as error:
            _missing(f"Chromium at {path} did not start: {str(error).splitlines()[0]}")
        yield launched
        launched.close()


@pytest.fixture
def open_page(browser):
    """Open a file in a fresh page with the network off: every request that is
    not for a file: or data: address is refused and remembered."""
    opened = []

    def open_(path):
        context = browser.new_context(viewport={"width": 1300, "height": 1100}, offline=True)
        context.set_default_timeout(10_000)  # a control that is not there fails fast
        page = context.new_page()
        page.requests, page.refused, page.errors = [], [], []
        page.on("request", lambda request: page.requests.append(request.url))
        page.on("pageerror", lambda error: page.errors.append(str(error)))

        def refuse(route):
            page.refused.append(route.request.url)
            route.abort()

        page.route(lambda url: not url.startswith(("file:", "data:")), refuse)
        page.goto(f"file://{os.path.abspath(path)}")
        opened.append(context)
        return page

    yield open_
    for context in opened:
        context.close()


def _step(page) -> int:
    return int(page.get_attribute(".minidist-player", "data-step"))


def _cells(page) -> list[str]:
    return page.eval_on_selector_all("rect.cell", "cells => cells.map(c => c.dataset.text)")


def _legend_symbols(page) -> list[str]:
    return page.eval_on_selector_all(".legend .entry", "es => es.map(e => e.dataset.symbol)")


def _expected_cells(replay, index) -> list[str]:
    n = replay.world_size
    return [animate.cell_text(cell, n) for rank in replay.frames[index].holdings for cell in rank]


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)


@pytest.fixture
def ring(tmp_path):
    replay = viz_samples.ring_all_reduce(4)
    path = animate.save_html(replay, tmp_path / "ring.html", fps=20)
    return replay, path


@pytest.mark.timeout(120)
def test_the_page_loads_with_the_network_off(ring, open_page):
    replay, path = ring
    page = open_page(path)
    assert page.refused == [] and page.errors == []
    assert all(url.startswith(("file:", "data:")) for url in page.requests), page.requests
    assert page.inner_text(".where") == "step 0 of 6 (before any message)"
    # Every button has its words (matplotlib's icons from a CDN were blank offline).
    labels = page.eval_on_selector_all("button", "buttons => buttons.map(b => b.innerText)")
    assert labels == ["|< first", "< back", "play", "forward >", "last >|"]
    # Step 0 is the state before any message: each rank its own data, no arrows.
    assert _cells(page) == _expected_cells(replay, 0) == [str(r) for r in range(4)
                                                           for _ in range(4)]
    assert page.locator(".msg").count() == 0


@pytest.mark.timeout(120)
def test_buttons_slider_and_keys_move_through_the_steps(ring, open_page):
    replay, path = ring
    page = open_page(path)
    moves = [("forward", 1), ("forward", 2), ("back", 1), ("last", 6), ("back", 5),
             ("first", 0)]
    for button, step in moves:
        page.click(f'button[data-do="{button}"]')
        assert _step(page) == step, button
        assert _cells(page) == _expected_cells(replay, step)
        assert page.locator(".msg").count() == len(replay.frames[step].messages)
        # The legend under the picture names every symbol its cells show.
        assert unnamed(_cells(page), _legend_symbols(page)) == []
    page.locator(".slider").fill("3")
    assert _step(page) == 3 and page.inner_text(".where") == "step 3 of 6"
    page.locator("body").click(position={"x": 5, "y": 600})  # focus off the slider
    for key, step in [("ArrowRight", 4), ("ArrowRight", 5), ("ArrowLeft", 4), ("End", 6),
                      ("Home", 0), ("ArrowLeft", 0)]:
        page.keyboard.press(key)
        assert _step(page) == step, key
    # Space plays to the end (20 frames a second here), then space pauses.
    page.keyboard.press(" ")
    assert page.inner_text('button[data-do="play"]') == "pause"
    page.wait_for_function("document.querySelector('.minidist-player').dataset.step === '6'",
                           timeout=10_000)
    page.wait_for_function("document.querySelector('[data-do=play]').innerText === 'play'")
    page.click('button[data-do="first"]')
    page.click('button[data-do="play"]')
    page.wait_for_function("+document.querySelector('.minidist-player').dataset.step >= 2")
    page.keyboard.press(" ")
    paused = _step(page)
    assert page.inner_text('button[data-do="play"]') == "play" and paused < 6
    page.wait_for_timeout(200)
    assert _step(page) == paused  # it stays where it was paused
    assert page.errors == [] and page.refused == []


@pytest.mark.timeout(120)
def test_following_a_rank_highlights_its_cells_and_messages(ring, open_page):
    replay, path = ring
    page = open_page(path)
    page.locator(".slider").fill("3")
    page.select_option(".follow", "1")
    assert page.locator("svg.following").count() == 1
    assert page.eval_on_selector_all(".rank.mine", "g => g.map(x => x.dataset.rank)") == ["1"]
    mine = [(m.source, m.target) for m in replay.frames[3].messages if 1 in (m.source, m.target)]
    drawn = page.eval_on_selector_all(
        ".msg.mine", "g => g.map(x => [+x.dataset.source, +x.dataset.target])")
    assert sorted(map(tuple, drawn)) == sorted(mine) == [(0, 1), (1, 2)]
    assert page.inner_text(".rank-line") == "rank 1 in this step: sends to 2; receives from 0"
    # The other ranks fade; the highlight stays on as the steps change.
    faded = page.eval_on_selector('.rank[data-rank="0"]', "g => getComputedStyle(g).opacity")
    assert float(faded) < 0.5
    page.click('button[data-do="forward"]')
    assert _step(page) == 4 and page.locator(".rank.mine").count() == 1
    page.select_option(".follow", "")
    assert page.locator("svg.following").count() == 0


@pytest.mark.timeout(120)
def test_step_0_and_step_3_differ_where_the_frames_say(ring, open_page):
    replay, path = ring
    page = open_page(path)
    picture = page.locator("svg")
    origin = picture.bounding_box()
    cells = page.locator("rect.cell")
    # Each cell's inside (its middle half: no outline), in the picture's pixels.
    insides = []
    for i in range(cells.count()):
        box = cells.nth(i).bounding_box()
        left, top = box["x"] - origin["x"], box["y"] - origin["y"]
        insides.append((slice(round(top + box["height"] / 4), round(top + 3 * box["height"] / 4)),
                        slice(round(left + box["width"] / 4), round(left + 3 * box["width"] / 4))))
    shot = _pixels(picture.screenshot())
    before = [shot[rows, columns] for rows, columns in insides]
    page.locator(".slider").fill("3")
    assert picture.bounding_box() == origin  # the same place: the pictures compare
    shot = _pixels(picture.screenshot())
    after = [shot[rows, columns] for rows, columns in insides]
    n = replay.world_size
    changed = [rank * n + cell for rank in range(n) for cell in range(n)
               if replay.frames[0].holdings[rank][cell] != replay.frames[3].holdings[rank][cell]]
    assert len(changed) == 12  # three reduce-scatter steps wrote 3 cells of each rank
    for index in changed:
        assert np.abs(after[index] - before[index]).max() > 64, f"cell {index} did not change"
    # The cells that did not change show what the frame says, as before.
    assert _cells(page) == _expected_cells(replay, 3)
    unchanged = sorted(set(range(n * n)) - set(changed))
    assert [_expected_cells(replay, 3)[i] for i in unchanged] == \
        [_expected_cells(replay, 0)[i] for i in unchanged]


@pytest.mark.timeout(120)
def test_the_exercise_replay_steps_both_runs_and_opens_at_the_difference(tmp_path, open_page):
    student, reference = viz_samples.ring_all_reduce(4), viz_samples.ring_all_reduce(4)
    pairs = tuple(Pair(index, mine, theirs, index == 2)
                  for index, (mine, theirs) in enumerate(zip(student.frames, reference.frames)))
    model = SideBySide(student, reference, pairs, marked=2,
                       difference="rank 0, step 2: you send chunk 3; the reference sends chunk 0")
    page = open_page(save_side_by_side_html(model, tmp_path / "replay.html"))
    assert page.refused == [] and page.errors == []
    assert _step(page) == 2 and page.locator(".panel").count() == 2
    assert page.inner_text(".note").startswith(">>> FIRST DIFFERENCE <<< rank 0, step 2")
    assert [page.inner_text(".panel h2").strip() for _ in range(1)] == ["your algorithm"]
    page.keyboard.press("Home")
    assert _step(page) == 0 and page.inner_text(".note") == ""
    assert page.locator("svg").count() == 2
