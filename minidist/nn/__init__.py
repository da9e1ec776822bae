"""minidist.nn: layers, losses and the Module system.

    from minidist import nn
    from minidist.nn import functional as F

    nn.init.manual_seed(0)                     # same model on every rank
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))
    loss = nn.CrossEntropyLoss()(model(x), labels)

Files, one idea each:

* ``module.py``, ``parameter.py``: Module (registration, parameters in a
  stable order, state dicts, train/eval) and Parameter
* ``functional.py``: every layer and loss as a function with a hand-written
  backward; the layers below call it
* ``im2col.py``: convolution as one matrix product
* ``linear.py``, ``conv.py``, ``pooling.py``, ``batchnorm.py``,
  ``dropout.py``, ``flatten.py``, ``activation.py``: the layers
* ``embedding.py``, ``layernorm.py``, ``attention.py``: the transformer's
  layers (Embedding, LayerNorm, MultiheadAttention; GELU is in
  ``activation.py``, scaled_dot_product_attention in ``functional.py``)
* ``erf.py``: erf and erfc to double precision, for the exact GELU
* ``container.py``: Sequential, ModuleList; ``loss.py``: the losses
* ``init.py``: initialisers and the seeding convention
* ``mobile.py``: MobileNet's depthwise separable block and its cost counts
* ``distillation.py``: knowledge distillation (Hinton) and FitNets hints
* ``recompute.py``: activation recomputation (checkpoint, checkpoint_sequential,
  CheckpointedSequential): keep segment inputs only, rerun in backward
* ``quantization.py``: INT8 post-training quantisation for inference
  (``from minidist.nn.quantization import quantize, model_size_bytes``)
* ``utils/``: torch's ``torch.nn.utils`` gradient clipping
  (``nn.utils.clip_grad_norm_(model.parameters(), 1.0)``, ``clip_grad_value_``,
  ``get_total_norm``, ``clip_grads_with_norm_``)
"""

from minidist.nn import distillation, functional, init, mobile, utils
from minidist.nn.activation import GELU, Identity, LogSoftmax, ReLU, Sigmoid, Softmax, Tanh
from minidist.nn.attention import MultiheadAttention
from minidist.nn.batchnorm import BatchNorm1d, BatchNorm2d
from minidist.nn.container import ModuleList, Sequential
from minidist.nn.conv import Conv2d
from minidist.nn.distillation import DistillationLoss, HintRegressor
from minidist.nn.dropout import Dropout
from minidist.nn.embedding import Embedding
from minidist.nn.flatten import Flatten
from minidist.nn.layernorm import LayerNorm
from minidist.nn.linear import Linear
from minidist.nn.loss import CrossEntropyLoss, MSELoss, NLLLoss
from minidist.nn.mobile import DepthwiseSeparableConv2d
from minidist.nn.module import IncompatibleKeys, Module
from minidist.nn.parameter import Parameter
from minidist.nn.pooling import AvgPool2d, MaxPool2d
from minidist.nn.recompute import CheckpointedSequential, checkpoint, checkpoint_sequential

__all__ = [
    "Module", "Parameter", "IncompatibleKeys", "Sequential", "ModuleList",
    "Linear", "Conv2d", "MaxPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d",
    "Dropout", "Flatten", "ReLU", "Tanh", "Sigmoid", "GELU", "Softmax", "LogSoftmax",
    "Identity", "Embedding", "LayerNorm", "MultiheadAttention", "DepthwiseSeparableConv2d", "CheckpointedSequential", "checkpoint", "checkpoint_sequential",
    "CrossEntropyLoss", "NLLLoss", "MSELoss", "DistillationLoss", "HintRegressor",
    "functional", "init", "mobile", "distillation", "utils",
]


def __getattr__(name):
    # torch users look for SyncBatchNorm in torch.nn. It needs the collectives,
    # which the layers never import (arrows point down only), so it lives with
    # the other strategies: say where, rather than a bare AttributeError.
    if name == "SyncBatchNorm":
        raise AttributeError(
            "minidist.nn has no SyncBatchNorm: it needs the collectives, so it lives with the "
            "strategies. Write `from minidist.parallel import SyncBatchNorm` (the same class, "
            "with torch's convert_sync_batchnorm(module, process_group=None)).")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
