"""The algorithm registry: every algorithm's cost is written once.

Each algorithm states its cost formula (and its traffic) with ``@cost`` right
above its code; the docstring and the module's table show that very text (the
tests below hold them to it), and :mod:`minidist.costmodel` computes with it.
The predictions are those of the cost model before the registry, frozen in
``cost_reference.py``.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from cost_reference import PARAMS, SECONDS, SIZES, WORLD_SIZES

from minidist import costmodel
from minidist.distributed.collectives import registry
from minidist.distributed.collectives.call import ALGORITHMS

ROOT = Path(__file__).resolve().parents[2]
COLLECTIVES = ROOT / "minidist" / "distributed" / "collectives"


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_algorithm_is_registered_with_a_cost_and_a_traffic():
    assert set(ALGORITHMS) == {"broadcast", "reduce", "all_reduce", "scatter", "gather",
                               "barrier", "all_gather", "reduce_scatter", "all_to_all"}
    for collective, algorithms in ALGORITHMS.items():
        assert list(registry.COSTS[collective]) == list(algorithms), collective
        for name, function in algorithms.items():
            cost = registry.COSTS[collective][name]
            assert cost is function.cost
            assert cost.text and callable(cost.seconds) and callable(cost.traffic)
            assert cost.traffic(1, 10, 4) == (0, 0), (collective, name)  # one rank sends nothing
            assert costmodel.predict(collective, name, 5, 1 << 20) > 0


def test_the_fingerprint_order_of_the_tables_is_kept():
    # The index of an algorithm is part of every message's tag: append, never reorder.
    assert list(ALGORITHMS["all_reduce"]) == [
        "coordinator", "reduce_broadcast", "recursive_doubling", "rabenseifner", "ring",
        "double_binary_tree", "two_shot", "one_shot"]
    assert list(ALGORITHMS["broadcast"]) == ["linear", "binomial", "scatter_allgather", "chain"]


@pytest.mark.parametrize("collective", sorted(ALGORITHMS))
def test_each_docstring_states_the_registered_formula(collective):
    for name, function in ALGORITHMS[collective].items():
        doc = _words(function.__doc__)
        wanted = "Cost: " + function.cost.text
        at = doc.find(wanted)
        assert at >= 0, f"{collective} {name}: the docstring should say {wanted!r}"
        after = doc[at + len(wanted):]
        # the formula ends there (a sentence or a remark may follow, not more terms)
        assert after == "" or after[0] in ".,;" or after.startswith(" ("), \
            f"{collective} {name}: the docstring goes on after the formula: {after[:40]!r}"


def _table(docstring: str) -> dict[str, str]:
    """A module docstring's table of costs: algorithm name -> its row's text
    (continuation lines joined)."""
    blocks = re.findall(r"^=+ +=+\n(.*?)^=+ +=+$", docstring, re.M | re.S)
    assert len(blocks) == 1, "one table of costs"
    rows: dict[str, str] = {}
    for line in blocks[0].splitlines():
        if line[:1].strip():
            name, _, text = line.partition(" ")
            rows[name] = text
        else:
            rows[name] += " " + line
    return {name: _words(text) for name, text in rows.items()}


@pytest.mark.parametrize("collective", sorted(ALGORITHMS))
def test_each_module_table_shows_the_registered_formulas(collective):
    module = importlib.import_module(f"minidist.distributed.collectives.{collective}")
    rows = _table(module.__doc__)
    assert set(rows) == set(ALGORITHMS[collective]), collective
    for name, row in rows.items():
        text = registry.text(collective, name)
        assert row.startswith(text), f"{collective} table, {name}: {row!r} is not {text!r}"
        assert row == text or row[len(text):].lstrip().startswith("("), (collective, name, row)


@pytest.mark.parametrize(("collective", "algorithm"), sorted(SECONDS))
def test_predictions_are_those_of_the_former_cost_model(collective, algorithm):
    params = costmodel.Params(**PARAMS)
    expected = iter(SECONDS[collective, algorithm])
    for n in WORLD_SIZES:
        for nbytes in SIZES:
            assert costmodel.predict(collective, algorithm, n, nbytes, params) == next(expected), \
                (collective, algorithm, n, nbytes)


def test_every_registered_algorithm_has_frozen_predictions():
    assert set(SECONDS) == {(collective, name) for collective, algorithms in ALGORITHMS.items()
                            for name in algorithms}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, by its full name (anywhere in the file)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith("minidist")}


def test_the_model_and_the_registry_import_no_algorithm():
    assert _imports(ROOT / "minidist" / "alpha_beta.py") == set()
    assert _imports(COLLECTIVES / "registry.py") <= {
        "minidist", "minidist.alpha_beta", "minidist.alpha_beta.Params",
        "minidist.alpha_beta.params_for"}
    algorithm_modules = {f"minidist.distributed.collectives.{collective}"
                         for collective in ALGORITHMS}
    from_algorithms = {name for name in _imports(ROOT / "minidist" / "costmodel.py")
                       if name.rpartition(".")[0] in algorithm_modules or name in algorithm_modules}
    assert from_algorithms == set()


def test_nothing_below_the_cost_model_imports_it():
    below = [*COLLECTIVES.glob("*.py"), *(COLLECTIVES.parent / "transport").glob("*.py"),
             ROOT / "minidist" / "alpha_beta.py"]
    for path in below:
        assert not any(name.startswith("minidist.costmodel") for name in _imports(path)), path


def test_the_notation():
    params = costmodel.Params(alpha=1.0, beta=10.0, gamma=100.0, exchange_beta=1000.0)
    seconds = registry.compile_formula("2 (n-1)/n N xbeta + ceil(log2 n) alpha", {})
    assert seconds(8, 4.0, params) == 2 * 7 / 8 * 4 * 1000 + 3
    folded = registry.compile_formula("log2 p alpha + (N beta if n != p else 0)", {})
    assert folded(8, 1.0, params) == 3 and folded(9, 1.0, params) == 13
    named = registry.compile_formula("S N gamma", {"S": lambda n, N, P: n + 1})
    assert named(3, 2.0, params) == 4 * 2 * 100
    with pytest.raises(ValueError, match="unknown name 'bta'"):
        registry.compile_formula("N bta", {})


def test_the_readme_counts_the_algorithms_the_registry_has():
    import re
    from pathlib import Path

    from minidist.distributed.collectives.call import ALGORITHMS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    said = re.search(r"(\d+) algorithms, each chosen by name", readme)
    assert said and int(said.group(1)) == sum(len(names) for names in ALGORITHMS.values())
