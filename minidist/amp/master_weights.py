"""MasterWeights: float32 copies of a float16 model's weights, which the
optimizer steps.

Mixed precision training (Micikevicius et al., 2018) computes the forward
and backward passes in float16 and keeps the weights in float32. Why not
step the float16 weights directly? An update ``lr * g`` smaller than half
the spacing of float16 numbers around the weight (2^-11 of it) rounds away:
a weight of 1.0 ignores every update below 0.00049, so late in training,
with small rates and gradients, float16 weights stop learning. Their
float32 masters keep 24 bits and accumulate the small updates; the float16
weights are rounded copies of them, re-made after each step.

One step, as the paper draws it::

    model = build_model().half()                   # float16 weights: the compute copy
    masters = MasterWeights(model)                 # float32 copies: the true weights
    optimizer = optim.SGD(masters.parameters(), lr=0.1)
    scaler = GradScaler()
    for x, y in loader:
        model.zero_grad()
        logits = model(x).astype(numpy.float32)    # the loss in float32
        scaler.scale(F.cross_entropy(logits, y)).backward()   # float16 gradients, scaled
        masters.copy_grads_to_masters()            # float32 copies of them
        scaler.step(optimizer)                     # unscale in float32; skip on inf/NaN
        scaler.update()
        masters.copy_masters_to_model()            # float16 weights re-made from the masters

A checkpoint holds four state_dicts: the model's, the optimizer's, the
scaler's and the masters' (``masters.state_dict()``; the float16 weights
are rounded copies of the masters, so they alone do not resume the run).

The loss is computed from float32 logits: log-softmax over float16 scores
loses digits, and a float16 loss times 2^16 overflows. (apex's O2 casts a
model's outputs to float32 the same way.)

What torch does, and why minidist does otherwise: ``torch.autocast``
keeps the model in float32 (the parameters *are* the master weights) and
casts, op by op, the inputs of matrix products and convolutions to float16
while running softmax, norms and losses in float32; each cast's backward
returns float32 gradients to the parameters. minidist's layers follow one
rule instead, "arrays stay in the dtype of the layer's weights"
(minidist/nn/functional.py): an autocast would need every op to consult a
global mode and a list of which ops run in which precision, and the dtype
of an array would no longer be read off the layer that made it. The model
in float16 beside float32 masters (the paper's recipe, and NVIDIA apex's
O2 level) changes no op: every array's dtype is the one printed on its
layer, and the three copies (float16 weights, float32 masters, float32
gradients) are objects a student can inspect.

Memory per parameter: 2 bytes (float16 weight) + 2 (float16 gradient) + 4
(float32 master) + 4 (its float32 gradient) + the optimizer's state in
float32, against 4 + 4 + state in float32 training. Mixed precision saves
memory in the activations (half the bytes), not in the weights. Speed: a
GPU multiplies float16 matrices several times faster than float32 ones;
NumPy has no float16 BLAS and multiplies them element by element in its own
loops, so on the CPU this is many times slower than float32: here it is a
lesson in numerics, not in speed.

Cost of the two copies: each reads and writes every weight once per step
(``copy_grads_to_masters`` allocates the float32 gradients on the first
step only, then casts in place).
"""

from __future__ import annotations

import numpy

from minidist.nn.parameter import Parameter
from minidist.tensor import no_grad


class MasterWeights:
    """``MasterWeights(model_or_parameters, dtype=numpy.float32)``: a master
    copy in ``dtype`` of every parameter, in the model's order (so the
    optimizer's state indices are the model's).

    A parameter already in ``dtype`` (a layer left in float32, as apex
    keeps BatchNorm) is its own master: nothing is copied for it.
    """

    def __init__(self, model_or_parameters, dtype=numpy.float32):
        self.dtype = numpy.dtype(dtype)
        if not numpy.issubdtype(self.dtype, numpy.floating):
            raise TypeError(f"MasterWeights: master weights need a floating dtype, got {self.dtype}")
        params = (model_or_parameters.parameters() if hasattr(model_or_parameters, "parameters")
                  else model_or_parameters)
        self.model_params = list(params)
        if not self.model_params:
            raise ValueError("MasterWeights got no parameters: pass the model, or "
                             "model.parameters() before it is used up")
        self.master_params = []
        for index, param in enumerate(self.model_params):
            if not numpy.issubdtype(param.data.dtype, numpy.floating):
                raise TypeError(f"MasterWeights: parameter {index} has dtype "
                                f"{param.data.dtype}; only floating-point weights have masters")
            if param.data.dtype == self.dtype:
                self.master_params.append(param)
            else:
                master = Parameter(param.data.astype(self.dtype), requires_grad=param.requires_grad)
                self.master_params.append(master)

    def parameters(self):
        """The master parameters, to build the optimizer with."""
        return iter(self.master_params)

    def copy_grads_to_masters(self) -> None:
        """Each master's gradient := its model parameter's, cast up (an inf
        or NaN stays one, so GradScaler still sees an overflow). A parameter
        without gradient leaves its master without one. Call it after
        backward, before ``scaler.step(optimizer)``."""
        for param, master in self._pairs():
            if param.grad is None:
                master.grad = None
            elif master.grad is None or master.grad.shape != param.grad.shape:
                master.grad = param.grad.astype(self.dtype)
            else:
                master.grad[...] = param.grad  # in place: the array stays the optimizer's

    @no_grad()
    def copy_masters_to_model(self) -> None:
        """Each model weight := its master, rounded to the model's dtype, in
        place (views of the model's arrays stay valid). Call it after the
        optimizer step; after a skipped step it copies the same values."""
        for param, master in self._pairs():
            param.data[...] = master.data

    def state_dict(self) -> dict:
        """The masters' values, to save beside the model's, the optimizer's
        and the GradScaler's ``state_dict``: the model's float16 weights are
        rounded copies of the masters, and an optimizer's state_dict holds
        its state (momenta), not its parameters, so a run resumed without
        this one would go on from rounded weights. Keys: ``dtype`` and
        ``masters`` (parameter index in the model's order -> a copy of its
        master; a parameter that is its own master is saved with the model)."""
        return {"dtype": self.dtype.name,
                "masters": {index: master.data.copy()
                            for index, (param, master)
                            in enumerate(zip(self.model_params, self.master_params))
                            if master is not param}}

    @no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Put saved masters back (in place: the optimizer's parameters stay
        the same objects) and re-make the model's weights from them. Refuses
        a state of another dtype, of other parameters or of other shapes."""
        dtype = numpy.dtype(state_dict["dtype"])
        if dtype != self.dtype:
            raise ValueError(f"MasterWeights.load_state_dict: the state holds {dtype} masters, "
                             f"these are {self.dtype}; make MasterWeights(model, dtype={dtype.name})")
        saved = {int(index): array for index, array in state_dict["masters"].items()}
        copied = [index for index, (param, master)
                  in enumerate(zip(self.model_params, self.master_params)) if master is not param]
        if sorted(saved) != copied:
            raise ValueError(f"MasterWeights.load_state_dict: the state has masters for "
                             f"parameters {sorted(saved)}, this model copies parameters {copied}: "
                             "load it into the model (and the same .half() layers) it was "
                             "saved from")
        for index in copied:
            master, array = self.master_params[index], numpy.asarray(saved[index])
            if array.shape != master.data.shape:
                raise ValueError(f"MasterWeights.load_state_dict: parameter {index} is "
                                 f"{master.data.shape} here, {array.shape} in the state")
            master.data[...] = array
        self.copy_masters_to_model()

    def _pairs(self):
        return ((param, master) for param, master in zip(self.model_params, self.master_params)
                if master is not param)

    def __repr__(self):
        copied = sum(1 for _ in self._pairs())
        size = sum(int(m.data.size) for _, m in self._pairs())
        return (f"MasterWeights({copied} of {len(self.model_params)} parameters copied to "
                f"{self.dtype}, {size:,} numbers)")
