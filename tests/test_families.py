"""minidist/parallel/ is one folder per family of strategies, each the same shape.

Read from the source with ``ast`` where the question is about the code's
shape (nothing is imported), and by importing where it is about what a user
gets: each family's face gives its reading order and names every module of
the family; ``minidist.parallel`` exports every face's names; a family uses
another only through that family's face, and says so in its docstring; no
file is over 500 lines; the paths from before the families still import,
with a warning that names the new path.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARALLEL = ROOT / "minidist" / "parallel"
FAMILIES = sorted(path.parent.name for path in PARALLEL.glob("*/__init__.py"))


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_the_families_are_the_ones_the_house_names():
    assert FAMILIES == sorted(["context", "data", "expert", "mesh", "model", "parameter_server",
                               "pipeline", "placements", "resilience", "tensor"])


@pytest.mark.parametrize("family", FAMILIES)
def test_each_face_gives_the_reading_order_of_every_module(family):
    face = PARALLEL / family / "__init__.py"
    doc = ast.get_docstring(ast.parse(face.read_text())) or ""
    assert "Read in this order" in doc, f"{family}/__init__.py: no reading order in its docstring"
    order = re.findall(r":mod:`\.(\w+)`", doc)
    modules = sorted(path.stem for path in (PARALLEL / family).glob("*.py")
                     if path.name != "__init__.py")
    assert sorted(set(order)) == modules, (
        f"{family}/__init__.py names {sorted(set(order))} in its reading order; the folder has "
        f"{modules}")


def test_the_package_exports_every_name_of_every_face_once():
    import minidist.parallel as parallel

    seen: dict[str, list[str]] = {}
    for family in FAMILIES:
        face = importlib.import_module(f"minidist.parallel.{family}")
        for name in face.__all__:
            assert hasattr(face, name), f"minidist.parallel.{family}.__all__ names {name!r}"
            seen.setdefault(name, []).append(family)
    unique = {name: families[0] for name, families in seen.items() if len(families) == 1}
    table = {name: family for family, names in parallel.FAMILIES.items() for name in names}
    assert table == unique, (
        "minidist.parallel.FAMILIES and the faces disagree: "
        f"missing {sorted(set(unique) - set(table))}, extra {sorted(set(table) - set(unique))}, "
        f"other family {sorted(n for n in set(table) & set(unique) if table[n] != unique[n])}")
    for name, family in unique.items():
        assert getattr(parallel, name) is getattr(
            importlib.import_module(f"minidist.parallel.{family}"), name)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchStrategy'"):
        parallel.NoSuchStrategy  # noqa: B018


def test_a_family_uses_another_only_through_its_face_and_says_so():
    crossings = []
    for family in FAMILIES:
        doc = ast.get_docstring(ast.parse((PARALLEL / family / "__init__.py").read_text())) or ""
        for path in (PARALLEL / family).glob("*.py"):
            for name in _imports(path):
                parts = name.split(".")
                if parts[:2] != ["minidist", "parallel"] or len(parts) < 3:
                    continue
                other = parts[2]
                if other not in FAMILIES or other == family:
                    continue
                if len(parts) > 3 and (PARALLEL / other / f"{parts[3]}.py").exists():
                    crossings.append(f"{path.relative_to(ROOT)} imports {name}: use the face "
                                     f"minidist.parallel.{other}")
                elif f"minidist.parallel.{other}" not in doc:
                    crossings.append(f"{family}/__init__.py does not say that {family} uses "
                                     f"minidist.parallel.{other}")
    assert not crossings, "\n".join(sorted(set(crossings)))


def test_the_checker_sees_a_family_reaching_into_another(tmp_path):
    """The test can fail: an import of another family's module is a crossing."""
    path = tmp_path / "x.py"
    path.write_text("from minidist.parallel.tensor.regions import copy_to_parallel_region\n")
    assert "minidist.parallel.tensor.regions" in _imports(path)


def test_no_file_of_the_strategies_is_over_500_lines():
    long = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
            for path in PARALLEL.rglob("*.py")}
    assert not {path: lines for path, lines in long.items() if lines > 500}


def test_an_old_path_imports_with_a_warning_naming_the_new_one():
    """In a fresh interpreter, so that no module is imported yet."""
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from minidist.parallel.zero import FullyShardedDataParallel, zero_bytes_per_step\n"
        "    from minidist.parallel import pipeline_schedules as ps\n"
        "from minidist.parallel.data.fsdp import FullyShardedDataParallel as new\n"
        "assert FullyShardedDataParallel is new\n"
        "assert ps.simulate_schedule.__module__ == 'minidist.parallel.pipeline.simulate'\n"
        "for warning in caught:\n"
        "    print(warning.category.__name__, warning.filename, str(warning.message))\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from minidist.parallel.tensor_parallel_gpt import group_of\n"
        "from minidist.distributed.device_mesh import as_group\n"
        "assert group_of is as_group\n"
        "print('replaced:', caught[-1].message)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    warned = [line for line in lines if line.startswith("MovedModuleWarning")]
    assert len(warned) == 2, done.stdout
    assert all(" <string> " in line for line in warned), "the warning points at the importing line"
    assert "minidist.parallel.zero moved to minidist.parallel.data.zero" in warned[0]
    assert "minidist.parallel.pipeline_schedules moved to minidist.parallel.pipeline." in warned[1]
    assert ("replaced: minidist.parallel.tensor_parallel_gpt.group_of is now "
            "minidist.distributed.device_mesh.as_group") in lines, done.stdout


def test_every_old_path_leads_to_modules_that_exist():
    from minidist.parallel.moved import MOVED

    for old, new in MOVED.items():
        assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), f"{old} is still a file"
        for module in new:
            assert (ROOT / (module.replace(".", "/") + ".py")).exists(), f"{old} -> {module}"


def test_every_file_the_readme_names_for_a_strategy_exists():
    """The README's "Where each strategy is": each `family/file.py` (and each
    bare `file.py` after it in the same cell, in that family) is a file."""
    text = (ROOT / "README.md").read_text().split("## Where each strategy is", 1)[1]
    table = text.split("\n## ", 1)[0]
    missing = []
    for row in table.splitlines():
        if not row.startswith("| ") or row.startswith("| to read"):
            continue
        cell = row.rstrip(" |").rsplit("|", 1)[1]
        family = None
        for name in re.findall(r"`([\w/]+\.py)`", cell):
            if "/" in name:
                family = name.split("/")[0]
                path = PARALLEL / name
            else:
                path = PARALLEL / family / name if family else PARALLEL / name
            if not path.exists():
                missing.append(f"{name} (in the row {row[:40]!r}...)")
    assert not missing, "the README names files that do not exist: " + ", ".join(missing)
