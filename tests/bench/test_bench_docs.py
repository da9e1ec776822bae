"""benchmarks/README.md stays a document for users, and timings stay out of the code.

* every ``benchmarks/bench_*.py`` has a section of benchmarks/README.md whose
  heading names it, and the section gives its command
  (``.venv/bin/python benchmarks/bench_X.py``);
* the README carries no work log: no git commit hash, no "branch", no
  "session", no "issue N" (the history stays in git);
* every ``benchmarks/README.md, "Section"`` a module cites names a heading
  that exists;
* no comment or docstring in minidist/ or viz/ carries a measured timing
  ("took 440 us", "19 ms on the 2-core EPYC"): a comment says why, the
  benchmark says how fast, and benchmarks/README.md keeps the figures.

Read from the files (nothing is imported or run).
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "benchmarks" / "README.md"

#: Files that still carry timings in comments because they were being
#: rewritten elsewhere when the timings were moved out: empty this list as
#: each is cleaned (the test then holds it).
NOT_YET_CLEANED: set[str] = set()

#: A time, a throughput or a ratio of times: "440 us", "0.1 s", "27 GB/s", "0.78x".
FIGURE = re.compile(r"(?<![\w.])\d[\d.,]*\s?(?:ms|us|µs|ns|s|x|[KMG]B/s|[KMG]iB/s)(?![\w/])")
#: Words that make a figure a measurement of this code on some machine,
#: rather than a parameter, a default, a formula or an example of output.
MEASURED = re.compile(
    r"\bmeasured\b|\btook\b|\bon the 2-core\b|\bon this machine\b|\bhere\)|\bhere[:,]"
    r"|\bEPYC\b|\bXeon\b|\bdevelopment (?:VM|machine)\b|\bin a profile\b"
    r"|\bof a (?:warm )?(?:\d-rank |trivial )*launch\b|\bof a `?minidist run|\bcost a\b"
    r"|\bof CPU\b|\bon one core\b|\bkernel time\b|\bthe time of\b|\b\d[\d.]* vs \d",
    re.IGNORECASE)

#: A published figure, cited with its source (one of the sources the lessons
#: cite, README.md "The sources the lessons cite": "Tsunashima's slides
#: measured 2-3x"), is not a measurement of this code.
CITED = re.compile(r"\b(?:Tsunashima|Dettmers|LSML|zhihu)\b|\bGreek (?:course )?slides\b")


def readme() -> str:
    return README.read_text(encoding="utf-8")


def sections() -> dict[str, str]:
    """Heading text -> the section's text, for every ``## `` heading."""
    parts = re.split(r"^## (.+)$", readme(), flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_benchmark_has_a_section_with_its_command():
    scripts = sorted(path.name for path in (ROOT / "benchmarks").glob("bench_*.py"))
    assert scripts
    found = sections()
    missing = []
    for script in scripts:
        owners = [body for heading, body in found.items() if f"`{script}`" in heading]
        if not owners:
            missing.append(f"{script}: no '## ...' heading names it")
        elif not any(f".venv/bin/python benchmarks/{script}" in body for body in owners):
            missing.append(f"{script}: its section gives no `.venv/bin/python benchmarks/{script}`")
    assert not missing, "\n".join(missing)


def test_the_readme_carries_no_work_log():
    text = readme()
    hashes = [word for word in re.findall(r"\b[0-9a-f]{7,40}\b", text)
              if re.search(r"[a-f]", word) and re.search(r"\d", word)]
    assert not hashes, f"git commit hashes in benchmarks/README.md: {hashes}"
    for pattern in (r"\bbranch(?:es)?\b", r"\bsessions?\b", r"\bissues? #?\d+"):
        hits = re.findall(rf".{{0,30}}{pattern}.{{0,30}}", text, flags=re.IGNORECASE)
        assert not hits, f"benchmarks/README.md is a document, not a log: {hits}"


def python_files():
    for folder in ("minidist", "viz"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def prose(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of every block of consecutive comments and every
    paragraph of every docstring or other string statement of ``path``."""
    source = path.read_text(encoding="utf-8")
    blocks: list[list] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#:").strip()
            # A "#:" comment documents the next name: a block of its own.
            if (blocks and blocks[-1][1] == token.start[0] - 1
                    and not token.string.startswith("#:")):
                blocks[-1][1] = token.start[0]
                blocks[-1][2] += " " + text
            else:
                blocks.append([token.start[0], token.start[0], text])
    found = [(first, text) for first, _, text in blocks]
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            line = node.lineno
            for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(node.value.value)):
                if all(row.startswith(" ") for row in paragraph.splitlines()):
                    continue  # an indented example of code or output
                found.append((line, " ".join(paragraph.split())))
                line += paragraph.count("\n") + 2
    # A quoted line of output ("measured 13.40 ms vs model 29.4 us") is an
    # example of what the code prints, not a measurement.
    return [(line, re.sub(r'"[^"]{0,200}"', '""', text)) for line, text in found]


def test_no_measured_timings_in_code_comments():
    offenders = []
    for path in python_files():
        name = path.relative_to(ROOT).as_posix()
        if name in NOT_YET_CLEANED:
            continue
        for line, text in prose(path):
            for sentence in re.split(r"(?<=[.;])\s+(?=[A-Z(])", text):
                if (FIGURE.search(sentence) and MEASURED.search(sentence)
                        and not CITED.search(sentence)):
                    offenders.append(f"{name}:{line}: {sentence[:160]}")
    assert not offenders, (
        "measured timings in comments (a comment says why; the figure belongs in "
        "benchmarks/README.md, under the benchmark that measures it):\n" + "\n".join(offenders))


def test_the_cleaned_list_names_files_that_exist():
    assert all((ROOT / name).is_file() for name in NOT_YET_CLEANED)


def test_citations_of_the_readme_name_its_sections():
    headings = [re.sub(r"`", "", heading) for heading in sections()]
    cited = re.compile(r"benchmarks/README(?:\.md)?,\s*\"([^\"]+)\"")
    dangling = []
    for path in python_files():
        name = path.relative_to(ROOT).as_posix()
        if name in NOT_YET_CLEANED:
            continue
        text = " ".join(path.read_text(encoding="utf-8").split())
        text = re.sub(r"\s*#:?\s*", " ", text)
        for title in cited.findall(text):
            if not any(heading.startswith(title) for heading in headings):
                dangling.append(f"{name}: {title!r}")
    assert not dangling, f"cited sections that benchmarks/README.md lacks: {dangling}"
