"""Every cross-reference in minidist's docstrings (``:mod:``, ``:func:``,
``:class:``, ``:meth:``, ``:data:``, ``:attr:`` with a full ``minidist.``
path) names something that exists: a reader who follows one lands on it, and
not on an old path that only forwards to where a module moved."""

import importlib
import re
from pathlib import Path

import minidist

PACKAGE = Path(minidist.__file__).parent
REFERENCE = re.compile(r":(?:mod|func|class|meth|data|attr):`~?(minidist(?:\.\w+)+)`")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        if hasattr(found, "__moved_to__"):
            return False   # an old path's stand-in: name the module it moved to
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_full_reference_in_a_docstring_resolves():
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for match in REFERENCE.finditer(path.read_text()):
            if not _resolves(match.group(1)):
                broken.append(f"{path.relative_to(PACKAGE.parent)}: {match.group(1)}")
    assert not broken, "references to nothing:\n" + "\n".join(broken)
