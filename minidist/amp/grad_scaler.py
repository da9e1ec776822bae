"""GradScaler: dynamic loss scaling, torch's ``torch.amp.GradScaler``.

Why: float16 holds numbers from about 6e-8 (its smallest subnormal,
2^-24) to 65504. Many gradients of a trained network are smaller than
2^-24 and round to zero in float16: those updates are lost
(:mod:`minidist.experiments.mixed_precision` counts them). Multiplying the loss
by a scale ``S`` before ``backward()`` multiplies every gradient by ``S``
(the chain rule is linear), which lifts them into float16's range; dividing
the float32 copies by ``S`` before the optimizer step undoes it
(Micikevicius et al., 2018, "Mixed Precision Training").

A fixed ``S`` is either too small (underflow) or too large (a gradient
overflows to inf). The *dynamic* scaler finds the largest safe one by trial:

* ``scale(loss)``: the loss times ``S``; call ``backward()`` on it.
* ``unscale_(optimizer)``: each of the optimizer's gradients times
  ``1 / S`` (in place, in the gradient's dtype, which must not be float16:
  unscaling there would underflow again), noting whether any was inf or
  NaN. Optional: ``step`` calls it if you did not (call it yourself to clip
  or inspect the true gradients first); at most once per step.
* ``step(optimizer)``: ``optimizer.step()``, *skipped* if a gradient was inf
  or NaN: the step would have corrupted the weights, and nothing is lost
  but one batch.
* ``update()``: after a skipped step ``S *= backoff_factor`` (0.5) and the
  count of good steps restarts; after ``growth_interval`` (2000) good steps
  in a row ``S *= growth_factor`` (2): the scale probes upwards now and
  then, so it follows the gradients as they shrink during training.

The rules are torch's to the bit (``_amp_update_scale_``; the scale is a
float32 whose product with a factor is taken in float64 and rounded, and
it never grows to inf), so a sequence of steps with the same gradients
gives the same scales, skips and weights as torch
(tests/core/test_amp.py checks it against torch's recorded run).

Cost: ``unscale_`` reads every gradient twice (the inf/NaN check, the
multiply) and writes it once; nothing is allocated but a boolean per
gradient for the check. ``scale`` adds one node to the graph.

Differences from torch: no ``device`` argument (``torch.amp.GradScaler``
takes one first, ``"cuda"`` or ``"cpu"``; here the arrays' backend decides),
so the arguments are those of ``torch.cuda.amp.GradScaler``; no support for
optimizers with their own scale handling (torch's
``_step_supports_amp_scaling``) or for sparse gradients; misuse raises a
ValueError or RuntimeError that says what to do where torch raises
AssertionError. torch asserts only ``growth_factor > 1`` and
``backoff_factor < 1``; it takes ``init_scale=0`` (every gradient zero, then
the weights NaN after the first step's division by 0), a NaN or infinite
``init_scale`` (every step skipped, silently, for ever), a backoff of 0 or
less and a growth interval below 1. None of those can train, so this
scaler refuses each with one line when ``enabled``.
"""

from __future__ import annotations

import math
import numbers

import numpy

from minidist import backend
from minidist.tensor import Tensor, no_grad


def _is_real(value) -> bool:
    """A real number (a bool is not one here: True would pass as 1.0)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# An optimizer's stage in the current step, torch's OptState.
_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


class GradScaler:
    """``GradScaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000, enabled=True)``.

    The training step, as with torch::

        scaler = GradScaler()
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)       # unscales, skips on inf/NaN
            scaler.update()

    With a float16 model, the optimizer steps float32 master copies of its
    weights: see :class:`minidist.amp.MasterWeights` for the two lines that
    go around ``scaler.step``. ``enabled=False`` makes every method a no-op
    and ``step`` a plain ``optimizer.step()``, so one script trains with and
    without scaling.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ):
        self._enabled = bool(enabled)
        if self._enabled:
            if not (_is_real(init_scale) and 0.0 < init_scale < math.inf):
                raise ValueError(f"GradScaler: init_scale must be a positive finite number (the "
                                 f"first loss scale; 2.0**16 is the usual start), got {init_scale!r}")
            if not (_is_real(growth_factor) and 1.0 < growth_factor < math.inf):
                raise ValueError(f"GradScaler: growth_factor must be a finite number > 1.0 (the "
                                 f"scale grows after good steps), got {growth_factor!r}")
            if not (_is_real(backoff_factor) and 0.0 < backoff_factor < 1.0):
                raise ValueError(f"GradScaler: backoff_factor must be in (0, 1) (the scale "
                                 f"shrinks after an overflow), got {backoff_factor!r}")
            if not (isinstance(growth_interval, numbers.Integral) and growth_interval >= 1):
                raise ValueError(f"GradScaler: growth_interval must be an int >= 1 (good "
                                 f"steps between growths), got {growth_interval!r}")
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._init_growth_tracker = 0
        # Set by the first scale(), as torch does: a step or update before any
        # scale() means the gradients were never scaled, and raises.
        self._scale: numpy.float32 | None = None
        self._growth_tracker: int | None = None
        # id(optimizer) -> {"stage": ..., "found_inf": bool or None}
        self._per_optimizer_states: dict[int, dict] = {}

    # -- the step -----------------------------------------------------------
    def scale(self, outputs):
        """``outputs`` times the current scale: a Tensor, or a list or tuple
        of them (nested), returned in the same shape. The scale is a float32
        0-d array, so a float16 loss becomes float32 here (as torch's 0-d
        product does) and ``2**16 * loss`` does not overflow float16."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._scale = numpy.float32(self._init_scale)
            self._growth_tracker = self._init_growth_tracker
        if isinstance(outputs, Tensor):
            xp = backend.of(outputs.data)
            return outputs * Tensor(xp.asarray(self._scale, dtype=numpy.float32))
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(output) for output in outputs)
        raise ValueError(f"GradScaler.scale: outputs must be a Tensor or a list or tuple of "
                         f"Tensors, got {type(outputs).__name__}")

    def unscale_(self, optimizer) -> None:
        """Divide the gradients of ``optimizer``'s parameters by the scale,
        in place, and note whether any is inf or NaN. Call it at most once
        between two ``update()`` calls, before ``step`` (which then does not
        unscale again)."""
        if not self._enabled:
            return
        self._check_scaled("unscale_")
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update(); call it once per step, then step() and update()")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step(); unscale before "
                               "stepping, or call update() to start the next step")
        # The reciprocal in float64, then rounded to float32, as torch (exact
        # for the powers of two the scale usually is).
        inv_scale = numpy.float32(1.0 / numpy.float64(self._scale))
        found_inf = False
        with no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    grad = param.grad
                    if grad is None:
                        continue
                    if grad.dtype == numpy.float16:
                        raise ValueError(
                            "Attempting to unscale FP16 gradients: the unscaled gradients "
                            "would underflow in float16 again. Give the optimizer float32 "
                            "master copies of a half model's weights: "
                            "masters = minidist.amp.MasterWeights(model), an optimizer on "
                            "masters.parameters(), and masters.copy_grads_to_masters() "
                            "before scaler.step(optimizer)")
                    # Checked before the multiply, as torch does.
                    if not bool(backend.of(grad).isfinite(grad).all()):
                        found_inf = True
                    if inv_scale != 1:
                        grad *= inv_scale
        state["found_inf"] = found_inf
        state["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """``unscale_(optimizer)`` if not done yet, then ``optimizer.step()``
        unless a gradient was inf or NaN; returns what ``optimizer.step()``
        returned (None when skipped). Once per ``update()``."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not supported if GradScaler is enabled: compute "
                               "the loss, scaler.scale(loss).backward(), then scaler.step(optimizer)")
        self._check_scaled("step")
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update(); call "
                               "scaler.update() once per step")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        result = None
        if not state["found_inf"]:
            result = optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    def update(self, new_scale=None) -> None:
        """Adjust the scale for the next step (see the module docstring), or
        set it to ``new_scale`` (a number, or a one-element array or Tensor
        without gradient). Call it once per step, after ``step``."""
        if not self._enabled:
            return
        self._check_scaled("update")
        if new_scale is not None:
            self._scale = numpy.float32(_one_number(new_scale))
        else:
            found = [state["found_inf"] for state in self._per_optimizer_states.values()
                     if state["found_inf"] is not None]
            if not found:
                raise RuntimeError("No inf checks were recorded prior to update(): call "
                                   "scaler.step(optimizer) (or unscale_) before scaler.update()")
            if any(found):
                self._scale = numpy.float32(float(self._scale) * self._backoff_factor)
                self._growth_tracker = 0
            else:
                successful = self._growth_tracker + 1
                if successful == self._growth_interval:
                    with numpy.errstate(over="ignore"):  # inf is caught just below
                        grown = numpy.float32(float(self._scale) * self._growth_factor)
                    if numpy.isfinite(grown):  # never past float32's range
                        self._scale = grown
                    self._growth_tracker = 0
                else:
                    self._growth_tracker = successful
        self._per_optimizer_states = {}

    # -- reading and setting ------------------------------------------------
    def get_scale(self) -> float:
        """The current scale as a Python float (``init_scale`` before the
        first ``scale()``), or 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale)

    def is_enabled(self) -> bool:
        return self._enabled

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self) -> int:
        """Good steps in a row since the last growth or skip."""
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else self._growth_tracker

    def state_dict(self) -> dict:
        """``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval`` and ``_growth_tracker`` (torch's keys); empty when
        disabled. Save it after ``update()``."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what :meth:`state_dict` returned (a no-op when disabled)."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled GradScaler; save one from an enabled scaler")
        missing = [key for key in ("scale", "growth_factor", "backoff_factor",
                                   "growth_interval", "_growth_tracker") if key not in state_dict]
        if missing:
            raise KeyError(f"GradScaler.load_state_dict: the state dict lacks {missing}; pass "
                           "what GradScaler.state_dict() returned")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale = numpy.float32(self._init_scale)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._growth_tracker is not None:
            self._growth_tracker = self._init_growth_tracker

    def __repr__(self):
        if not self._enabled:
            return "GradScaler(enabled=False)"
        return (f"GradScaler(scale={self.get_scale()}, growth_factor={self._growth_factor}, "
                f"backoff_factor={self._backoff_factor}, growth_interval={self._growth_interval}, "
                f"growth_tracker={self._get_growth_tracker()})")

    # -- helpers ------------------------------------------------------------
    def _check_scaled(self, function: str) -> None:
        if self._scale is None:
            raise RuntimeError(f"GradScaler.{function}() before any scaler.scale(...): the "
                               "gradients were never scaled. Call scaler.scale(loss).backward() "
                               "earlier in the step")

    def _state(self, optimizer) -> dict:
        return self._per_optimizer_states.setdefault(
            id(optimizer), {"stage": _READY, "found_inf": None})


def _one_number(value) -> float:
    """``update(new_scale)``'s argument as a float: a number, or a
    one-element array or Tensor that needs no gradient."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, Tensor):
        if value.requires_grad:
            raise ValueError("update(new_scale): new_scale must not require a gradient")
        value = value.data
    if hasattr(value, "size") and value.size == 1:
        return float(backend.to_numpy(value).reshape(()))
    raise ValueError(f"update(new_scale): new_scale must be a float or a one-element array or "
                     f"Tensor, got {value!r}")
