"""Loaded by Python at start when this folder is on PYTHONPATH (the lesson
tests put it there): every picture a lesson saves is checked for text that
overlaps or leaves the figure (tests/viz/text_layout.py), and the problems
are written, one JSON line per picture, to $MINIDIST_PICTURE_CHECK. The
lessons draw about thirty pictures inline; this sees all of them without
moving their code."""

import os

if os.environ.get("MINIDIST_PICTURE_CHECK"):
    import json

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from tests.viz.text_layout import text_problems

    _save = Figure.savefig

    def _checked_savefig(self, fname, *args, **kwargs):
        result = _save(self, fname, *args, **kwargs)
        problems = text_problems(self)
        if problems:
            with open(os.environ["MINIDIST_PICTURE_CHECK"], "a") as file:
                file.write(json.dumps({"picture": os.path.basename(str(fname)),
                                       "problems": problems}) + "\n")
        return result

    Figure.savefig = _checked_savefig
