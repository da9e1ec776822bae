"""Experiments the lessons run, kept here so they can also run on their own
(``python -m minidist.experiments.NAME``) in a reduced form in seconds or
a full form with ``--full``.

* :mod:`minidist.experiments.large_batch`: test accuracy against the global
  batch size with a constant rate, the linear scaling rule plus warm-up, and
  LARS; and "increase the batch size instead of decaying the rate".
* :mod:`minidist.experiments.mixed_precision`: float16 gradients that
  underflow without loss scaling and survive with it, and mixed precision's
  loss curve beside float32's.
"""
