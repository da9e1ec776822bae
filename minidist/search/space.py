"""A search space: for each hyper-parameter, the distribution a trial draws it from.

    space = {
        "lr": LogUniform(1e-3, 1.0),          # equal chance for each factor of ten
        "momentum": Uniform(0.0, 0.95),
        "hidden": Int(16, 256, log=True),     # 16, 17, ..., 256, log-spaced chances
        "activation": Categorical(["relu", "tanh"]),
    }

A space is a plain dict of name -> distribution, drawn in the dict's order.
The same space drives both searches: :meth:`sample` draws from a NumPy
generator (the plain random search), :meth:`suggest` asks an Optuna trial
(``trial.suggest_float(name, low, high, log=True)`` and friends), so one
objective and one space run under either engine.

**Reproducible whichever worker draws.** :func:`sample_params` seeds a fresh
generator from ``(seed, trial number)`` for every trial, so trial 7's
parameters are the same whether worker 0 or worker 3 runs it, and whether
the search has one worker or eight. (One generator per worker, advanced
trial after trial, would make them depend on who ran what before.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


@dataclass(frozen=True)
class Uniform:
    """A float drawn evenly from [low, high)."""

    low: float
    high: float

    def __post_init__(self):
        low, high = _number("Uniform low", self.low), _number("Uniform high", self.high)
        if not low < high:
            raise ValueError(f"Uniform needs low < high, got low={low!r}, high={high!r}")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))

    def suggest(self, trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high)


@dataclass(frozen=True)
class LogUniform:
    """A float whose logarithm is uniform in [log low, log high): as likely
    between 0.001 and 0.01 as between 0.1 and 1 (learning rates, weight decay)."""

    low: float
    high: float

    def __post_init__(self):
        low, high = _number("LogUniform low", self.low), _number("LogUniform high", self.high)
        if not 0 < low < high:
            raise ValueError(f"LogUniform needs 0 < low < high, got low={low!r}, high={high!r}"
                             " (a logarithm needs positive bounds; use Uniform to include 0)")

    def sample(self, rng: np.random.Generator) -> float:
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))

    def suggest(self, trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, log=True)


@dataclass(frozen=True)
class Int:
    """An integer in [low, high], both included; ``log=True`` spaces the chances
    logarithmically (16..256 hidden units: 16-32 as likely as 128-256)."""

    low: int
    high: int
    log: bool = False

    def __post_init__(self):
        for which, value in (("low", self.low), ("high", self.high)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"Int {which} must be an int, got {value!r}")
        if not self.low <= self.high:
            raise ValueError(f"Int needs low <= high, got low={self.low}, high={self.high}")
        if self.log and self.low < 1:
            raise ValueError(f"Int(log=True) needs low >= 1, got low={self.low}")

    def sample(self, rng: np.random.Generator) -> int:
        if not self.log:
            return int(rng.integers(self.low, self.high + 1))
        # The same rule as Optuna's: uniform in log over [low - 0.5, high + 0.5), rounded.
        drawn = math.exp(rng.uniform(math.log(self.low - 0.5), math.log(self.high + 0.5)))
        return int(min(max(round(drawn), self.low), self.high))

    def suggest(self, trial, name: str) -> int:
        return trial.suggest_int(name, int(self.low), int(self.high), log=self.log)


@dataclass(frozen=True)
class Categorical:
    """One of ``choices``, each as likely (None, bools, ints, floats, strings:
    what Optuna can store)."""

    choices: tuple

    def __post_init__(self):
        if isinstance(self.choices, (str, bytes)):
            raise TypeError(f"Categorical needs a list of choices, got the string {self.choices!r}")
        try:
            choices = tuple(self.choices)
        except TypeError:
            raise TypeError(f"Categorical needs a list of choices, got {self.choices!r}") from None
        if not choices:
            raise ValueError("Categorical needs at least one choice")
        for choice in choices:
            if choice is not None and not isinstance(choice, (bool, int, float, str)):
                raise TypeError(f"Categorical choices must be None, bool, int, float or str, "
                                f"got {choice!r}")
        object.__setattr__(self, "choices", choices)

    def sample(self, rng: np.random.Generator):
        return self.choices[int(rng.integers(len(self.choices)))]

    def suggest(self, trial, name: str):
        return trial.suggest_categorical(name, list(self.choices))


DISTRIBUTIONS = (Uniform, LogUniform, Int, Categorical)


def check_space(space) -> dict:
    """The space as a dict, or a clear error for what is wrong with it."""
    if not isinstance(space, dict):
        raise TypeError("a search space is a dict of name -> distribution (Uniform, LogUniform, "
                        f"Int, Categorical), got {type(space).__name__}")
    if not space:
        raise ValueError("the search space is empty: give at least one hyper-parameter")
    for name, distribution in space.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"hyper-parameter names must be non-empty strings, got {name!r}")
        if not isinstance(distribution, DISTRIBUTIONS):
            raise TypeError(
                f"space[{name!r}] is {distribution!r}: give a distribution, such as "
                f"LogUniform(1e-3, 1.0), Uniform(0.0, 0.9), Int(16, 256) or "
                f"Categorical(['a', 'b']) (a fixed value is Categorical([value]))")
    return dict(space)


def trial_rng(seed: int, number: int) -> np.random.Generator:
    """The generator of trial ``number`` of a search seeded with ``seed``."""
    return np.random.default_rng([int(seed), int(number)])


def sample_params(space: dict, seed: int, number: int) -> dict:
    """Trial ``number``'s parameters: a function of (seed, number) alone."""
    rng = trial_rng(seed, number)
    return {name: distribution.sample(rng) for name, distribution in space.items()}


def trial_seed(seed: int, number: int) -> int:
    """A seed for the trial's own randomness (weights, data order), also from
    (seed, number) alone, independent of the parameters' draws."""
    return int(np.random.SeedSequence([int(seed), int(number), 1]).generate_state(1)[0])


__all__ = ["Uniform", "LogUniform", "Int", "Categorical", "check_space", "sample_params",
           "trial_rng", "trial_seed"]
