"""Nothing in the repository that a student cannot look up.

Every tracked text file (``git ls-files``: .py, .md, .toml, .json, .txt)
is read for two kinds of words that point to something outside it:

* an issue number ("issue N", "Issue #N", "issues N and M"): the tracker
  is not part of the course; say what the thing is instead, and point a
  measurement to benchmarks/results/ or to its section of
  benchmarks/README.md;
* a seed file, the name the course documents had while the project was
  built ("seed 00N", "SEED_00N", "the seed's layer", "/seeds/"): cite the
  source itself, by its authors and title ("Tsunashima's slides",
  "Dettmers, Model Parallelism in Deep Learning, 2014"; README.md, "The
  sources the lessons cite");
* a course topic number ("course topic N"), from a list that is not in the
  repository: name the lesson that teaches it.

Random seeds are not flagged: "seed=0", "seed 0", "a seed of 7", "seeds 1
and 2", "np.random.default_rng(seed)" (the patterns are tested on such
strings below). A seed file's number has three digits with a leading zero,
as the documents were numbered; a random seed's possessive ("each seed's
run") reads better as "the run of each seed" and is flagged too.

This file is left out of the scan: it spells the patterns out. Its own
examples are written with "~" for the space ("issue~23"), put back when a
test reads them, so that no other scan of the repository mistakes them for
the real thing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".md", ".toml", ".json", ".txt")
#: Not the repository's text: a checkout's shared folder, and this file.
LEFT_OUT_FOLDERS = ("shared/",)
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: "issue N", "Issue #N", "issues N and M", "issue # N" (but not "issued N"
#: or "an issue in N ranks").
ISSUE = re.compile(r"\bissues?\s*#\s*\d+|\bissues?\s+\d+\b", re.IGNORECASE)
#: "seed 00N", "Seed 00N's", "seeds 00N", "SEED_00N", "seed-00N", "/seeds/",
#: "the seed's", "the seeds'".
SEED_FILE = re.compile(r"\bseeds?[ _-]?0\d\d\b|\bseed's\b|\bseeds'(?!\w)|/seeds/",
                       re.IGNORECASE)
#: "course topic 20", "course topics 14 and 15".
TOPIC = re.compile(r"\bcourse topics?\s+\d+", re.IGNORECASE)
PATTERNS = {"an issue number": ISSUE, "a seed file": SEED_FILE, "a course topic number": TOPIC}


def tracked_text_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True, timeout=60).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout: no list of tracked files")
    return sorted(name for name in listed.split("\0")
                  if name.endswith(SUFFIXES) and name != THIS_FILE
                  and not name.startswith(LEFT_OUT_FOLDERS) and (ROOT / name).is_file())


def offending_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, what it names, the words) for every hit in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for kind, pattern in PATTERNS.items():
            for match in pattern.finditer(line):
                found.append((number, kind, match.group(0)))
    return found


@pytest.mark.parametrize("text", [
    "the simulator at scale (issue~23)", "Issue~32: these ran for minutes",
    "see issue~#12", "issues~3 and 4", "issue~20's targets", "ISSUE~7",
])
def test_an_issue_number_is_found(text):
    assert [kind for _, kind, _ in offending_lines(text.replace("~", " "))] == ["an issue number"]


@pytest.mark.parametrize("text", [
    "seed~004's 1000x500 layer", "Seed~002 measured 2-3x slower", "seed~003",
    "SEED_004 = [(10,), (10, 500)]", "the seed's picture", "in the seeds' words",
    "/work/shared/seeds/000_7c66619e4fc72389.txt", "seeds~001 and 003",
])
def test_a_seed_file_is_found(text):
    assert [kind for _, kind, _ in offending_lines(text.replace("~", " "))] == ["a seed file"]


@pytest.mark.parametrize("text", ["(course topic~20)", "course topics~14 and 15"])
def test_a_course_topic_number_is_found(text):
    assert [kind for _, kind, _ in offending_lines(text.replace("~", " "))] == ["a course topic number"]


@pytest.mark.parametrize("text", [
    "seed=0", "rng = np.random.default_rng(seed)", "a seed of 7", "seed 0; seeds 1 and 2",
    "mean over seeds", "fewer seeds and batch sizes", "the seed-to-seed spread",
    "random_seed: the seed of Q's draws", "seeds=(0, 1, 2)", "f\"{'seed ' + str(s):>7}\"",
    "no issue with that", "the ranks issue their sends", "an issue in 12 ranks",
    "issued 12 requests", "SEEDS = (0,) if QUICK else (0, 1, 2)", "seed 42", "seed 100",
    "the course's topics", "lesson 12", "topic 3 of the lesson",
])
def test_random_seeds_and_other_words_are_not_flagged(text):
    assert offending_lines(text) == []


def test_no_tracked_text_names_an_issue_or_a_seed_file():
    files = tracked_text_files()
    assert any(name.endswith(".py") for name in files)
    hits = []
    for name in files:
        text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        hits += [f"{name}:{number}: {kind}: {words!r}"
                 for number, kind, words in offending_lines(text)]
    assert not hits, (
        f"{len(hits)} lines name what a student cannot look up (an issue number: say what "
        "the thing is, or point to benchmarks/results/; a seed file: cite the source by "
        "its authors and title; a course topic: name the lesson):\n" + "\n".join(hits))
