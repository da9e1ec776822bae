"""Write minidist/data/digits.npz, the bundled 8x8 handwritten digits, once.

Run from the repository root with scikit-learn installed (only this script
needs it; minidist itself never imports scikit-learn):

    python scripts/make_digits.py

The images are the 1,797-sample test partition ("optdigits.tes") of the UCI
"Optical Recognition of Handwritten Digits" data by E. Alpaydin and
C. Kaynak (1998), https://doi.org/10.24432/C50P49, licensed CC BY 4.0, in the
copy that scikit-learn (BSD-3-Clause) ships as ``sklearn.datasets.load_digits``.
See minidist/data/DIGITS_LICENSE.txt.

The file keeps the samples in scikit-learn's order and stores no split: the
train/test rule lives in ``minidist.data.digits`` and depends only on this
order and the labels, so it needs no random generator and cannot drift.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

OUTPUT = Path(__file__).resolve().parent.parent / "minidist" / "data" / "digits.npz"


def main() -> int:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        print(
            "This script reads scikit-learn's copy of the digits. Install it first "
            "(`pip install scikit-learn`); minidist itself does not need it.",
            file=sys.stderr,
        )
        return 1

    bunch = load_digits()
    pixels = bunch.images
    labels = bunch.target
    # The source stores small whole numbers as floats; refuse to write if that
    # ever stops being true rather than silently rounding.
    if pixels.shape != (1797, 8, 8) or labels.shape != (1797,):
        raise SystemExit(
            f"unexpected shapes {pixels.shape}, {labels.shape}; expected (1797, 8, 8), (1797,)"
        )
    if not (np.array_equal(pixels, np.round(pixels)) and pixels.min() >= 0 and pixels.max() <= 16):
        raise SystemExit("pixels are not whole numbers in 0..16; the source has changed")
    if set(np.unique(labels)) != set(range(10)):
        raise SystemExit("labels are not the digits 0..9; the source has changed")

    images = pixels.astype(np.uint8)
    targets = labels.astype(np.uint8)
    np.savez_compressed(OUTPUT, images=images, labels=targets)

    digest = hashlib.sha256(images.tobytes() + targets.tobytes()).hexdigest()
    print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size} bytes)")
    print(f"images {images.shape} {images.dtype}, labels {targets.shape} {targets.dtype}")
    print(f"class counts {np.bincount(targets).tolist()}")
    print(f"sha256 of images+labels bytes: {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
