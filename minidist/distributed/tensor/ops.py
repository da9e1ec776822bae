"""The ops on DTensors: one placement rule each (torch's sharding propagation).

An op on DTensors runs on the local shards, and its rule says, per mesh dim,
which layout the result has and where a message is needed. The rules, one
mesh dim at a time (``S(d)`` Shard, ``R`` Replicate, ``P`` Partial(sum or
avg); "grad of x partial" means the backward sums x's gradient over that
mesh dim, :mod:`~minidist.distributed.tensor.partial_gradient`):

Elementwise ``+ - * /`` (dims aligned from the right, as broadcasting):

==================  ============  ==================================================
operands            result        note
==================  ============  ==================================================
R, R                R
S(d), S(e)          S(d)          d and e the same aligned dim, no broadcast there
S(d), R             S(d)          R the same length there: cut locally (no message,
                                  backward all_gather); R broadcast (length 1 or no
                                  such dim): grad of R partial
P, P (+ -)          P             the same reduce_op
P * R, P / R        P             linear in P; grad of R partial
P * c, P / c        P             c a Python number
P + R, P + c        refused       it would count R (or c) n times
anything else       refused       redistribute one operand first
==================  ============  ==================================================

Unary: ``neg``, ``astype`` keep any layout; ``tanh exp log sqrt relu sigmoid
gelu pow(c)`` keep S and R and refuse P (not linear: f(a + b) != f(a) + f(b)).

``matmul`` / ``@`` (a of ndim >= 2, b of ndim 2) and ``F.linear(x, w, b)``
(``x @ w.T``):

====================================  ============  ======================
a, b                                  result        backward
====================================  ============  ======================
S(batch dim of a), R                  S(same)       grad of b partial
R, S(last of b)                       S(last)       grad of a partial
S(last of a), S(second-to-last of b)  P(sum)        no message
R, R                                  R
P, R / R, P                           P             grad of the R partial
anything else                         refused
====================================  ============  ======================

F.linear's bias on a Partial result is added once in the sum: by the rank
at coordinate 0 of each Partial mesh dim (the others add nothing), so the
reduction gives ``x W^T + b`` as torch's RowwiseParallel does; its gradient
is the sum of the result's gradient on every rank with no message (a
Partial's gradient is the whole, Replicate). Adding after the reduction
would change the layout the caller gets, so the rule does it here.

Reductions and shapes: ``sum``/``mean`` over a sharded dim give P (mean
divides by the global length), over others keep the layout, a P stays P;
``transpose``/``.T`` move the Shard dims; ``reshape``/``view`` keep the
layout where every sharded dim is untouched (the same length, the same
product of the dims before it), else refused.

nn.functional: ``layer_norm`` over dims no Shard cuts, weight and bias
Replicate (their grads partial where x is sharded); ``softmax``,
``log_softmax`` over a dim no Shard cuts, no P; ``dropout`` with p > 0 in
training is refused (a mask drawn per shard is not the mask one process
draws; torch keeps one by offsetting its generator, minidist has none),
p = 0 or eval passes the DTensor; ``embedding(idx, table)``: table R: the
result takes the indices' layout (grad of the table partial where they are
sharded); table S(1): S(last); table S(0) (vocab-parallel): each rank looks
up the rows it holds, zeros elsewhere, P(sum); ``cross_entropy`` of
Replicate logits is local, of Shard(1) (class) logits only inside
``loss_parallel()``: 3 all_reduces of N numbers forward (the row max, the
sum of exponentials, the target's logit), none backward, result Replicate.

Cost of the rules: a loop over the mesh dims, no message; the messages are
the ones the tables say. Where a plain Tensor meets a DTensor (other than a
Python number) the op is refused, as torch: make it a DTensor
(``DTensor.from_local(t, mesh, [Replicate()])``) first.

The operators are methods of :class:`~minidist.distributed.tensor.DTensor`,
installed below (this file imports dtensor.py, so dtensor.py cannot import
it); the functions of nn.functional reach the rules through
``minidist.tensor.placement_rules``.
"""

from __future__ import annotations

import operator

import numpy as np

from minidist import backend
from minidist import tensor as _tensor_module
from minidist.distributed.tensor import redistribute as _redistribute
from minidist.distributed.tensor.dtensor import DTensor
from minidist.distributed.tensor.partial_gradient import all_reduce_gradient
from minidist.distributed.tensor.placements import (
    DTensorSpec,
    Partial,
    Replicate,
    Shard,
    layout_text,
)
from minidist.nn import functional as F
from minidist.tensor import Tensor, matmul

_LINEAR = ("sum", "avg")


# --------------------------------------------------------------------------- helpers


def _text(x):
    if isinstance(x, DTensor):
        return f"{layout_text(x._spec.placements)} shape {x._spec.shape}"
    return repr(x)


def _refuse(op, operands, takes, fix):
    layouts = ", ".join(_text(x) for x in operands)
    raise TypeError(f"{op} on DTensors laid out {layouts}: no placement rule for that; {op} "
                    f"takes {takes}. {fix}")


def _local(x: DTensor, partial_dims=()) -> Tensor:
    """x's local shard as a plain node; its gradient summed over ``partial_dims``."""
    return all_reduce_gradient(x.to_local(), x._spec.mesh, partial_dims)


def _out(local: Tensor, mesh, placements, shape, op) -> DTensor:
    spec = DTensorSpec(mesh, placements, shape, local.data.dtype)
    want = spec.local_shape_and_offset()[0]
    if tuple(local.data.shape) != tuple(want):   # a rule's bug, never the user's
        raise RuntimeError(f"{op}: the local result has shape {tuple(local.data.shape)}, the "
                           f"layout {layout_text(placements)} of {tuple(shape)} wants {want}")
    return DTensor._node(local.data, spec, local, lambda g: g, op)


def _same_mesh(op, *xs):
    meshes = [x._spec.mesh for x in xs if isinstance(x, DTensor)]
    if any(m != meshes[0] for m in meshes[1:]):
        raise ValueError(f"{op}: the DTensors lie on different meshes; redistribute them onto "
                         f"one (full_tensor() and distribute_tensor)")
    return meshes[0]


def _operand(op, x):
    """A DTensor, or a Python number; a plain Tensor is refused (as torch)."""
    if isinstance(x, DTensor):
        return x
    if isinstance(x, (bool, int, float, np.integer, np.floating)):
        return float(x) if isinstance(x, (np.floating, float)) else x
    raise TypeError(f"{op}: a DTensor with a plain {type(x).__name__} (mixed operands are "
                    f"refused, as torch): make it a DTensor first, "
                    f"DTensor.from_local(t, mesh, [Replicate()]) when every rank holds the whole")


# --------------------------------------------------------------------------- elementwise


def _binary(name, x, y):
    fn = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
          "div": operator.truediv}[name]
    x, y = _operand(name, x), _operand(name, y)
    mesh = _same_mesh(name, x, y)
    tensors = [t for t in (x, y) if isinstance(t, DTensor)]
    shape = np.broadcast_shapes(*[t._spec.shape for t in tensors]) if len(tensors) == 2 \
        else tensors[0]._spec.shape
    n = len(shape)
    cut = {id(t): list(t._spec.placements) for t in tensors}     # after local chunks
    partial = {id(t): set() for t in tensors}
    out = []
    takes = ("per mesh dim: (R, R), (S(d), S(d)) on the same aligned dim, (S(d), R), (P, P) "
             "for + and -, (P, R) and (P, number) for * and / (the Partial first for /)")
    for i in range(mesh.ndim):
        px = x._spec.placements[i] if isinstance(x, DTensor) else None
        py = y._spec.placements[i] if isinstance(y, DTensor) else None
        pp = [p for p in (px, py) if p is not None]
        if any(isinstance(p, Partial) and p.reduce_op not in _LINEAR for p in pp):
            _refuse(name, (x, y), takes, "A Partial(max/min) must be reduced first: "
                    "redistribute it to Replicate()")
        if len(pp) == 1:                                   # with a number
            p = pp[0]
            if isinstance(p, Partial) and (name in ("add", "sub") or (name == "div" and py is not None)):
                _refuse(name, (x, y), takes, "Adding a number to a Partial would count it once "
                        "per rank: redistribute the Partial to Replicate() first")
            out.append(p)
            continue
        if px == py and not isinstance(px, Shard):
            if isinstance(px, Partial) and name in ("mul", "div"):
                _refuse(name, (x, y), takes, "A product of two Partials is not a sum of "
                        "products: redistribute one to Replicate() first")
            out.append(px)
            continue
        if isinstance(px, Partial) or isinstance(py, Partial):
            other, mine = (y, x) if isinstance(px, Partial) else (x, y)
            p_of_other = py if other is y else px
            ok = isinstance(p_of_other, Replicate) and (
                name == "mul" or (name == "div" and isinstance(px, Partial)))
            if not ok:
                _refuse(name, (x, y), takes, "A Partial plus a Replicate would count the "
                        "Replicate once per rank: redistribute the Partial to Replicate() first")
            partial[id(other)].add(i)
            out.append(px if isinstance(px, Partial) else py)
            continue
        # Shard against Shard or Replicate
        dims = {}
        for t, p in ((x, px), (y, py)):
            if isinstance(p, Shard):
                k = p.dim + n - len(t._spec.shape)
                if t._spec.shape[p.dim] != shape[k]:
                    _refuse(name, (x, y), takes, f"{p} falls on a dim of length "
                            f"{t._spec.shape[p.dim]} broadcast to {shape[k]}: shard the other "
                            f"operand there, or replicate this one")
                dims[id(t)] = k
        ks = set(dims.values())
        if len(ks) != 1:
            _refuse(name, (x, y), takes, "The two Shards fall on different dims of the result: "
                    "redistribute one to the other's Shard")
        k = ks.pop()
        for t, p in ((x, px), (y, py)):
            if isinstance(p, Replicate):
                j = k - (n - len(t._spec.shape))
                if j >= 0 and t._spec.shape[j] == shape[k] and shape[k] != 1:
                    cut[id(t)][i] = Shard(j)          # R -> S(j): a local chunk, no message
                else:
                    partial[id(t)].add(i)             # broadcast: its gradient is partial
        out.append(Shard(k))
    locals_ = []
    for t in (x, y):
        if isinstance(t, DTensor):
            dims = partial[id(t)]
            if tuple(cut[id(t)]) != t._spec.placements:
                t = t.redistribute(t._spec.mesh, cut[id(t)])
            locals_.append(_local(t, dims))
        else:
            locals_.append(t)
    return _out(fn(locals_[0], locals_[1]), mesh, out, shape, name)


def _unary(name, x, fn, linear=False):
    if not linear and any(isinstance(p, Partial) for p in x._spec.placements):
        _refuse(name, (x,), "Shard and Replicate (it is not linear: f of a sum of terms is not "
                "the sum of f of each)", "Redistribute the Partial to Replicate() first")
    return _out(fn(_local(x)), x._spec.mesh, x._spec.placements, x._spec.shape, name)


def _pow(x, exponent):
    if isinstance(exponent, DTensor) or not isinstance(exponent, (int, float)):
        raise TypeError("pow of a DTensor: the exponent must be a Python number (a DTensor "
                        "exponent has no placement rule)")
    return _unary("pow", x, lambda t: t ** exponent)


def _astype(x, dtype):
    return _unary("astype", x, lambda t: t.astype(dtype), linear=True)


# --------------------------------------------------------------------------- matmul, linear


def _matmul_rule(op, a_spec, b_spec, operands):
    """(result placements, mesh dims where a's grad is partial, the same for b)."""
    a_nd = len(a_spec.shape)
    takes = ("per mesh dim: (S(batch dim of a), R) -> S, (R, S(last of b)) -> S(last), "
             "(S(last of a), S(second-to-last of b)) -> Partial, (R, R), (P, R), (R, P)")
    fix = ("Redistribute an operand (e.g. a.redistribute(mesh, [Replicate()])) to one of "
           "these pairs")
    out, pa_dims, pb_dims = [], set(), set()
    for i, (pa, pb) in enumerate(zip(a_spec.placements, b_spec.placements)):
        if isinstance(pa, Replicate) and isinstance(pb, Replicate):
            out.append(Replicate())
        elif isinstance(pa, Shard) and pa.dim < a_nd - 1 and isinstance(pb, Replicate):
            out.append(Shard(pa.dim))
            pb_dims.add(i)
        elif isinstance(pa, Replicate) and pb == Shard(1):
            out.append(Shard(a_nd - 1))
            pa_dims.add(i)
        elif pa == Shard(a_nd - 1) and pb == Shard(0):
            out.append(Partial("sum"))
        elif isinstance(pa, Partial) and pa.reduce_op in _LINEAR and isinstance(pb, Replicate):
            out.append(pa)
            pb_dims.add(i)
        elif isinstance(pb, Partial) and pb.reduce_op in _LINEAR and isinstance(pa, Replicate):
            out.append(pb)
            pa_dims.add(i)
        else:
            _refuse(op, operands, takes, fix)
    return out, pa_dims, pb_dims


def _all_dtensors(op, *xs):
    for x in xs:
        if not isinstance(x, DTensor):
            raise TypeError(f"{op}: a DTensor with a {type(x).__name__} (mixed operands are "
                            f"refused, as torch): make it a DTensor first, "
                            f"DTensor.from_local(t, mesh, [Replicate()]) when every rank holds "
                            f"the whole")


def _check_matmul(op, a, b):
    _all_dtensors(op, a, b)
    if a.ndim < 2 or b.ndim != 2:
        raise TypeError(f"{op} on DTensors of {a.ndim} and {b.ndim} dims: minidist's rule "
                        f"takes a of 2 or more dims and b of 2 (a batched b has no rule)")
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"{op}: shape mismatch {a.shape} @ {b.shape}")
    return _same_mesh(op, a, b)


def _matmul(a, b):
    mesh = _check_matmul("matmul", a, b)
    out, pa, pb = _matmul_rule("matmul", a._spec, b._spec, (a, b))
    local = matmul(_local(a, pa), _local(b, pb))
    return _out(local, mesh, out, tuple(a.shape[:-1]) + (b.shape[1],), "matmul")


def _transposed(spec, perm):
    placements = [Shard(perm.index(p.dim)) if isinstance(p, Shard) else p
                  for p in spec.placements]
    return DTensorSpec(spec.mesh, placements, [spec.shape[k] for k in perm], spec.dtype)


def _linear(x, weight, bias=None):
    _all_dtensors("linear", x, weight, *([] if bias is None else [bias]))
    if weight.ndim != 2 or x.ndim < 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input {x.shape} and weight {weight.shape} do not fit "
                         f"(the input's last dim is the weight's second)")
    mesh = _same_mesh("linear", x, weight, bias)
    w_t = _transposed(weight._spec, [1, 0])
    out, px, pw = _matmul_rule("linear (x @ w.T)", x._spec, w_t, (x, weight))
    y = F.linear(_local(x, px), _local(weight, pw))
    shape = tuple(x.shape[:-1]) + (weight.shape[0],)
    result = _out(y, mesh, out, shape, "linear")
    if bias is None:
        return result
    partial_dims = [i for i, p in enumerate(out) if isinstance(p, Partial)]
    if not partial_dims:
        return _binary("add", result, bias)
    return _add_once(result, bias, partial_dims)


def _add_once(y, bias, partial_dims):
    """y (Partial on ``partial_dims``) + bias, the bias added by the rank at
    coordinate 0 of those dims only; its gradient is every rank's."""
    mesh, last = y._spec.mesh, y.ndim - 1
    cut, partial = [], set()
    for i, (py, pb) in enumerate(zip(y._spec.placements, bias._spec.placements)):
        if py == Shard(last) and pb in (Shard(0), Replicate()):
            cut.append(Shard(0))                 # the bias's columns of this rank
        elif isinstance(pb, Replicate) and py != Shard(last):
            cut.append(Replicate())
            if isinstance(py, Shard):
                partial.add(i)                   # the rows' sums of g: a term each
        else:
            cut = None
            break
    if cut is None or bias.ndim != 1:
        _refuse("linear's bias", (y, bias), "a 1-D bias, Replicate where the result is "
                "Partial or Shard of a batch dim, Shard(0) or Replicate where it is Shard(-1)",
                "Redistribute the bias to Replicate()")
    b = bias if tuple(cut) == bias._spec.placements else bias.redistribute(mesh, cut)
    ly, lb = y.to_local(), _local(b, partial)
    coordinate = mesh.get_coordinate()
    adds = all(coordinate[i] == 0 for i in partial_dims)
    data = ly.data + lb.data if adds else ly.data.copy()

    def backward(g):
        return g, g.reshape(-1, g.shape[-1]).sum(axis=0)

    local = Tensor._make(data, (ly, lb), backward, "add bias once")
    return _out(local, mesh, y._spec.placements, y._spec.shape, "linear")


# --------------------------------------------------------------------------- reductions, shapes


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted(a % ndim for a in axes))


def _sum(x, axis=None, keepdims=False):
    axes = _axes(axis, x.ndim)
    out = []
    for p in x._spec.placements:
        if isinstance(p, Shard) and p.dim in axes:
            out.append(Partial("sum"))
        elif isinstance(p, Shard):
            out.append(Shard(p.dim if keepdims else p.dim - sum(a < p.dim for a in axes)))
        elif isinstance(p, Partial) and p.reduce_op not in _LINEAR:
            _refuse("sum", (x,), "Shard, Replicate and Partial(sum/avg)",
                    "Redistribute the Partial to Replicate() first")
        else:
            out.append(p)
    shape = [1 if k in axes else s for k, s in enumerate(x.shape)] if keepdims else \
        [s for k, s in enumerate(x.shape) if k not in axes]
    local = _local(x).sum(axis=axes, keepdims=keepdims)
    return _out(local, x._spec.mesh, out, shape, "sum")


def _mean(x, axis=None, keepdims=False):
    axes = _axes(axis, x.ndim)
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return _binary("mul", _sum(x, axis, keepdims), 1.0 / max(count, 1))   # the global length


def _transpose(x, *axes):
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    perm = [a % x.ndim for a in axes] if axes else list(reversed(range(x.ndim)))
    spec = _transposed(x._spec, perm)
    return _out(_local(x).transpose(tuple(perm)), x._spec.mesh, spec.placements, spec.shape,
                "transpose")


def _reshape(x, *shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = [int(s) for s in shape]
    if shape.count(-1) == 1:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        shape[shape.index(-1)] = x.size // known if known else 0
    if int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ValueError(f"reshape of a DTensor of shape {x.shape} into {tuple(shape)}: the "
                         f"element counts differ")
    out = []
    for p in x._spec.placements:
        if not isinstance(p, Shard):
            out.append(p)
            continue
        before = int(np.prod(x.shape[:p.dim], dtype=np.int64))
        new = [k for k in range(len(shape)) if shape[k] == x.shape[p.dim]
               and int(np.prod(shape[:k], dtype=np.int64)) == before]
        if not new:
            _refuse("reshape", (x,), "shapes that leave every sharded dim as it is (the same "
                    "length, the same product of the dims before it)",
                    f"Redistribute to Replicate() on that mesh dim first, or keep dim {p.dim} "
                    f"({x.shape[p.dim]}) whole in the new shape {tuple(shape)}")
        out.append(Shard(new[0]))
    local_shape = DTensorSpec(x._spec.mesh, out, shape, x.dtype).local_shape_and_offset()[0]
    return _out(_local(x).reshape(local_shape), x._spec.mesh, out, shape, "reshape")


def _along_whole(op, x, axis):
    axis = axis % x.ndim
    for p in x._spec.placements:
        if isinstance(p, Partial) or (isinstance(p, Shard) and p.dim == axis):
            _refuse(op, (x,), f"a dim no Shard cuts (here {axis}) and no Partial",
                    f"Redistribute so that dim {axis} is whole (Replicate(), or Shard another "
                    f"dim); for a loss over sharded classes use loss_parallel()")
    return axis


def _softmax(x, axis=-1):
    axis = _along_whole("softmax", x, axis)
    return _out(_local(x).softmax(axis=axis), x._spec.mesh, x._spec.placements, x._spec.shape,
                "softmax")


def _log_softmax(x, axis=-1):
    axis = _along_whole("log_softmax", x, axis)
    return _out(_local(x).log_softmax(axis=axis), x._spec.mesh, x._spec.placements,
                x._spec.shape, "log_softmax")


# --------------------------------------------------------------------------- nn.functional


def _gelu(x, approximate="none"):
    return _unary("gelu", x, lambda t: F.gelu(t, approximate))


def _dropout(x, p):
    raise TypeError(f"dropout(p={p}) in training on a DTensor: a mask drawn on each shard is not "
                    f"the one a single process would draw (minidist has no generator shared "
                    f"across ranks), so it is refused; drop out the local tensor "
                    f"(F.dropout(x.to_local(), p)) if independent masks are what you want")


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    count = 1 if isinstance(normalized_shape, (int, np.integer)) else len(normalized_shape)
    first = x.ndim - count
    for p in x._spec.placements:
        if isinstance(p, Partial) or (isinstance(p, Shard) and p.dim >= first):
            _refuse("layer_norm", (x,), "a layout no Shard of the normalized dims and no Partial "
                    "(Shard(1) of a sequence is fine)", "Redistribute the input so that the "
                    "normalized dims are whole")
    partial = {i for i, p in enumerate(x._spec.placements) if isinstance(p, Shard)}
    params = []
    for name, param in (("weight", weight), ("bias", bias)):
        if param is None:
            params.append(None)
            continue
        if not isinstance(param, DTensor) or any(not isinstance(p, Replicate)
                                                  for p in param._spec.placements):
            raise TypeError(f"layer_norm on a DTensor: the {name} must be a Replicate DTensor "
                            f"(SequenceParallel() on the LayerNorm makes it one), got "
                            f"{_text(param)}")
        params.append(_local(param, partial))
    local = F.layer_norm(_local(x), normalized_shape, params[0], params[1], eps)
    return _out(local, x._spec.mesh, x._spec.placements, x._spec.shape, "layer_norm")


def _embedding(indices, weight, padding_idx=None):
    if not isinstance(weight, DTensor):
        raise TypeError("embedding: DTensor indices into a plain table: make the table a "
                        "DTensor (distribute_tensor(table, mesh, [Replicate()]))")
    mesh = weight._spec.mesh
    if isinstance(indices, DTensor):
        ids_placements, ids = indices._spec.placements, indices.data
        ids_shape = indices._spec.shape
    else:
        ids = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
        ids_placements, ids_shape = (Replicate(),) * mesh.ndim, ids.shape
    nd = len(ids_shape)
    out, partial, vocab = [], set(), False
    takes = ("per mesh dim: table Replicate (the result takes the indices' layout), table "
             "Shard(1) with Replicate indices (result Shard(-1)), table Shard(0) with Replicate "
             "indices (vocab-parallel, result Partial)")
    for i, (pw, pi) in enumerate(zip(weight._spec.placements, ids_placements)):
        if isinstance(pi, Partial):
            _refuse("embedding", (indices, weight), takes, "Indices cannot be Partial")
        if isinstance(pw, Replicate):
            out.append(pi)
            if isinstance(pi, Shard):
                partial.add(i)
        elif isinstance(pi, Replicate) and pw == Shard(1):
            out.append(Shard(nd))
        elif isinstance(pi, Replicate) and pw == Shard(0):
            out.append(Partial("sum"))
            vocab = True
        else:
            _refuse("embedding", (indices, weight), takes, "Redistribute the indices to "
                    "Replicate() or the table to one of these")
    table = _local(weight, partial)
    shape = tuple(ids_shape) + (weight.shape[1],)
    (rows, _), (low, _) = weight._spec.local_shape_and_offset()
    ids = np.asarray(backend.to_numpy(ids))
    if ids.size and (ids.min() < 0 or ids.max() >= weight.shape[0]):
        raise IndexError(f"embedding: an index is out of range for a table of "
                         f"{weight.shape[0]} rows (valid 0..{weight.shape[0] - 1})")
    if table.data.size == 0:   # an empty chunk (torch.chunk's trailing ones): nothing to look up
        zeros = backend.of(table.data).zeros(ids.shape + (table.data.shape[1],),
                                             table.data.dtype)
        local = Tensor._make(zeros, (table,), lambda g: (backend.of(g).zeros_like(table.data),),
                             "embedding")
        return _out(local, mesh, out, shape, "embedding")
    if not vocab:
        return _out(F.embedding(ids, table, padding_idx), mesh, out, shape, "embedding")
    mine = (ids >= low) & (ids < low + rows)
    pad = padding_idx - low if padding_idx is not None and low <= padding_idx < low + rows \
        else None
    looked = F.embedding(np.where(mine, ids - low, 0), table, pad)
    local = looked * Tensor(mine[..., None].astype(table.data.dtype))
    return _out(local, mesh, out, shape, "embedding")


#: how many loss_parallel() contexts are open (the placements family's)
_loss_parallel = [0]


def loss_parallel_depth() -> list:
    """The counter ``loss_parallel()`` raises and lowers."""
    return _loss_parallel


def _cross_entropy(logits, target, reduction="mean", ignore_index=-100):
    mesh = logits._spec.mesh
    if isinstance(target, DTensor):
        if any(not isinstance(p, Replicate) for p in target._spec.placements):
            raise TypeError("cross_entropy on DTensors: the labels must be Replicate")
        target = target.to_local().data
    sharded = [i for i, p in enumerate(logits._spec.placements) if p != Replicate()]
    if not sharded:
        local = F.cross_entropy(logits.to_local(), target, reduction, ignore_index)
        return _out(local, mesh, logits._spec.placements, local.data.shape, "cross_entropy")
    if not _loss_parallel[0]:
        _refuse("cross_entropy", (logits,), "Replicate logits, or logits Shard(1) (the classes) "
                "inside loss_parallel()", "Wrap the loss in `with loss_parallel():` "
                "(from minidist.parallel import loss_parallel), or redistribute the logits to "
                "Replicate() (an all_gather of the whole vocabulary)")
    if logits.ndim != 2 or any(p != Shard(1) for i, p in enumerate(logits._spec.placements)
                               if i in sharded):
        _refuse("cross_entropy", (logits,), "(N, classes) logits Shard(1) inside loss_parallel()",
                "Flatten to (N, classes) (logits.reshape(-1, classes)) with the classes "
                "sharded: Shard(1)")
    return _vocab_parallel_loss(logits, target, reduction, ignore_index, sharded)


def _vocab_parallel_loss(logits, target, reduction, ignore_index, mesh_dims):
    """Cross entropy of class-sharded logits: 3 all_reduces of N numbers."""
    mesh, spec = logits._spec.mesh, logits._spec
    (_, width), (_, low) = spec.local_shape_and_offset()
    z = backend.to_numpy(logits.data)
    labels = np.asarray(backend.to_numpy(target.data if isinstance(target, Tensor) else target))
    labels = labels.reshape(-1)
    if labels.shape[0] != z.shape[0]:
        raise ValueError(f"cross_entropy: {z.shape[0]} rows of logits, {labels.shape[0]} labels")
    counted = labels != ignore_index
    count = int(counted.sum())

    def reduce(array, op):
        for i in mesh_dims:
            array = _redistribute._all_reduce(array, spec, i, op)
        return array

    row_max = reduce(z.max(axis=1) if width else np.full(z.shape[0], -np.inf, z.dtype), "max")
    exp = np.exp(z - row_max[:, None])
    sum_exp = reduce(exp.sum(axis=1), "sum")
    mine = counted & (labels >= low) & (labels < low + width)
    rows = np.nonzero(mine)[0]
    picked = np.zeros(z.shape[0], z.dtype)
    picked[rows] = z[rows, labels[rows] - low] - row_max[rows]
    picked = reduce(picked, "sum")
    losses = np.where(counted, np.log(sum_exp) - picked, 0).astype(z.dtype)
    if reduction == "mean":
        value = np.asarray(losses.sum() / count if count else np.nan, z.dtype)
    elif reduction == "sum":
        value = np.asarray(losses.sum(), z.dtype)
    else:
        value = losses
    local = logits.to_local()

    def backward(g):
        g = backend.to_numpy(g)
        grad = exp / sum_exp[:, None]
        grad[rows, labels[rows] - low] -= 1
        grad[~counted] = 0
        scale = g.reshape(-1, 1) if reduction == "none" else (
            g / max(count, 1) if reduction == "mean" else g)
        return (backend.from_numpy(grad * scale),)

    node = Tensor._make(backend.from_numpy(value), (local,), backward, "loss_parallel")
    return _out(node, mesh, [Replicate()] * mesh.ndim, value.shape, "cross_entropy")


# --------------------------------------------------------------------------- installing


def _rbinary(name):
    return lambda self, other: _binary(name, other, self)


_METHODS = {
    "__add__": lambda self, other: _binary("add", self, other),
    "__radd__": _rbinary("add"),
    "__sub__": lambda self, other: _binary("sub", self, other),
    "__rsub__": _rbinary("sub"),
    "__mul__": lambda self, other: _binary("mul", self, other),
    "__rmul__": _rbinary("mul"),
    "__truediv__": lambda self, other: _binary("div", self, other),
    "__rtruediv__": _rbinary("div"),
    "__neg__": lambda self: _unary("neg", self, operator.neg, linear=True),
    "__pow__": _pow,
    "__matmul__": _matmul,
    "__rmatmul__": lambda self, other: _matmul(other, self),
    "exp": lambda self: _unary("exp", self, Tensor.exp),
    "log": lambda self: _unary("log", self, Tensor.log),
    "sqrt": lambda self: _unary("sqrt", self, Tensor.sqrt),
    "tanh": lambda self: _unary("tanh", self, Tensor.tanh),
    "sigmoid": lambda self: _unary("sigmoid", self, Tensor.sigmoid),
    "relu": lambda self: _unary("relu", self, Tensor.relu),
    "astype": _astype,
    "sum": _sum,
    "mean": _mean,
    "transpose": _transpose,
    "T": property(lambda self: _transpose(self)),
    "reshape": _reshape,
    "view": _reshape,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
}
for _name, _method in _METHODS.items():
    setattr(DTensor, _name, _method)
DTensor.__hash__ = Tensor.__hash__
DTensor._is_distributed = True

_tensor_module.placement_rules.update(
    linear=_linear, gelu=_gelu, dropout=_dropout, layer_norm=_layer_norm,
    embedding=_embedding, cross_entropy=_cross_entropy)

__all__ = ["loss_parallel_depth"]
