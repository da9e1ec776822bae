"""The split backward (minidist.split_backward): the input half I, then the
weight half W, against one plain ``output.backward(gradient)``.

The reference is the plain backward, bit for bit (np.array_equal, float32
and float64): the inputs' .grad after I, every parameter's .grad after W,
and nothing of the parameters touched by I. Then what I must not do (a
weight GEMM, counted through an instrumented array; a weight gradient a
tripwire refuses), what W keeps (bytes counted by hand for a Linear stack),
and the errors."""

import re

import numpy as np
import pytest

from minidist import Tensor, memory, nn, no_grad
from minidist.models import GPT, Block, GPTConfig
from minidist.nn import conv_gemm_sizing
from minidist.nn import functional as F
from minidist.split_backward import WeightGradients, backward_input
from minidist.tensor import _split_by_requires_grad, matmul
from minidist.train import build_model

DTYPES = [np.float32, np.float64]


def _rng(seed=0):
    return np.random.default_rng(seed)


def _params(model):
    return list(model.parameters()) if hasattr(model, "parameters") else list(model)


def _clear(params):
    for p in params:
        p.grad = None


def _compare(forward, params, arrays, gradient=None, before=None):
    """Plain backward and split backward of ``forward(*leaves)``, a leaf
    that requires a gradient made of each of ``arrays`` (the split's
    inputs), from the same .grad (None, or ``before``'s arrays): every
    input's and parameter's .grad must be the same bits."""
    params = _params(params)

    def leaves():
        _clear(params)
        if before is not None:
            for p, value in zip(params, before):
                p.grad = None if value is None else value.copy()
        return [Tensor(a, requires_grad=True) for a in arrays]

    plain = leaves()
    forward(*plain).backward(gradient)
    plain_inputs = [t.grad for t in plain]
    plain_params = [None if p.grad is None else p.grad.copy() for p in params]

    split = leaves()
    start = [None if p.grad is None else p.grad.copy() for p in params]
    out = forward(*split)
    pending = backward_input(out, gradient, inputs=split)
    assert isinstance(pending, WeightGradients) and not pending.done
    for p, value in zip(params, start):   # I leaves the parameters alone
        assert (p.grad is None and value is None) or np.array_equal(p.grad, value)
    for mine, theirs in zip(split, plain_inputs):
        assert mine.grad.dtype == theirs.dtype and np.array_equal(mine.grad, theirs)
    pending.backward_weight()
    assert pending.done and pending.nbytes == 0
    for p, theirs in zip(params, plain_params):
        if theirs is None:
            assert p.grad is None
        else:
            assert p.grad.dtype == theirs.dtype and np.array_equal(p.grad, theirs), p.shape
    return pending


# --------------------------------------------------------------------------
# Bit for bit against one backward


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_on_a_batch_and_on_a_sequence(dtype, bias):
    layer = nn.Linear(6, 4, bias=bias, rng=1, dtype=dtype)
    for shape in [(5, 6), (2, 3, 6)]:
        x = _rng().standard_normal(shape).astype(dtype)
        g = _rng(1).standard_normal(shape[:-1] + (4,)).astype(dtype)
        _compare(layer, layer, [x], g)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_course_mlp_and_cnn(dtype):
    mlp = build_model("mlp").to(dtype)
    _compare(lambda x: F.cross_entropy(mlp(x), [1, 3, 0, 9]), mlp,
             [_rng().standard_normal((4, 64)).astype(dtype)])
    cnn = build_model("cnn").to(dtype)
    _compare(lambda x: F.cross_entropy(cnn(x), [1, 3, 7]), cnn,
             [_rng().standard_normal((3, 1, 8, 8)).astype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stride, padding, groups", [(1, 1, 1), (2, 0, 1), (1, 1, 2), (2, 1, 4)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("one_gemm", [True, False])
def test_conv2d_by_stride_padding_groups(dtype, stride, padding, groups, bias, one_gemm, monkeypatch):
    # Both ways of the weight gradient, whichever this machine's BLAS picks:
    # the one-GEMM way copies g channel-major, and col2im must read that copy
    # whether or not the weight is asked for.
    monkeypatch.setattr(conv_gemm_sizing, "weight_gradient_in_one_gemm", lambda xp: one_gemm)
    conv = nn.Conv2d(4, 8, 3, stride=stride, padding=padding, groups=groups, bias=bias,
                     rng=2, dtype=dtype)
    x = _rng().standard_normal((2, 4, 7, 6)).astype(dtype)
    _compare(lambda t: (conv(t) ** 2).sum(), conv, [x])


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_2d_in_training_and_layer_norm(dtype):
    conv = nn.Conv2d(3, 5, 3, padding=1, rng=3, dtype=dtype)
    norm = nn.BatchNorm2d(5, dtype=dtype)
    model = nn.Sequential(conv, norm, nn.ReLU())
    _compare(lambda t: (model(t) ** 2).mean(), model,
             [_rng().standard_normal((4, 3, 5, 5)).astype(dtype)])
    ln = nn.LayerNorm(6, dtype=dtype)
    ln.weight.data[...] = _rng(4).standard_normal(6)
    head = nn.Linear(6, 3, rng=5, dtype=dtype)
    layers = nn.Sequential(ln, head)
    _compare(lambda t: (layers(t) ** 2).sum(), layers,
             [_rng().standard_normal((2, 4, 6)).astype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_layer_norm_written_as_elementwise_ops_with_its_weight_and_bias(dtype):
    weight = nn.Parameter(_rng(6).standard_normal(6).astype(dtype))
    bias = nn.Parameter(_rng(7).standard_normal(6).astype(dtype))

    def forward(x):
        centred = x - x.mean(axis=-1, keepdims=True)
        scaled = centred / ((centred * centred).mean(axis=-1, keepdims=True) + 1e-5).sqrt()
        return ((scaled * weight + bias) ** 3).sum()

    _compare(forward, [weight, bias], [_rng().standard_normal((3, 6)).astype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_and_a_matmul_with_a_parameter(dtype):
    table = nn.Embedding(10, 4, rng=8, dtype=dtype)
    projection = nn.Parameter(_rng(9).standard_normal((4, 5)).astype(dtype))
    idx = np.array([[1, 3, 3, 9], [0, 1, 1, 1]])

    def forward(x):
        return ((matmul(table(idx) + x, projection)) ** 2).sum()

    _compare(forward, [table.weight, projection], [_rng().standard_normal((2, 4, 4)).astype(dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_multihead_attention_passes_the_input_gradient_through(dtype):
    attention = nn.MultiheadAttention(8, 2, batch_first=True, rng=10, dtype=dtype)

    def forward(x):
        out, _ = attention(x, x, x, need_weights=False)
        return (out ** 2).sum()

    _compare(forward, attention, [_rng().standard_normal((2, 5, 8)).astype(dtype)])


def _gpt_config():
    return GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_gpt_block(dtype):
    block = Block(_gpt_config(), rng=11, dtype=dtype)
    g = _rng(1).standard_normal((2, 6, 8)).astype(dtype)
    _compare(block, block, [_rng().standard_normal((2, 6, 8)).astype(dtype)], g)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_whole_gpt_with_its_tied_embedding_and_output_layer(dtype):
    gpt = GPT(_gpt_config(), rng=12, dtype=dtype)
    idx = _rng().integers(0, 11, (2, 6))
    targets = _rng(1).integers(0, 11, (2, 6)).reshape(-1)

    def loss(logits):
        return F.cross_entropy(logits.reshape(-1, 11), targets)

    # A first stage: the token ids need no gradient; I does nothing, W all.
    _compare(lambda: loss(gpt(idx)), gpt, [])

    # With an input activation added after the embeddings, the tied weight's
    # two uses (the lm_head's GEMM, deferred at a split node, and the
    # embedding's scatter, on the weight side) are both summed in W.
    t = gpt.transformer

    def forward(extra):
        x = t.wte(idx) + t.wpe(np.arange(6)) + extra
        for block in t.h:
            x = block(x)
        return loss(gpt.lm_head(t.ln_f(x)))

    _compare(forward, gpt, [_rng(2).standard_normal((2, 6, 8)).astype(dtype)])
    # And on .grad already holding a micro-batch's gradient.
    held = [_rng(3).standard_normal(p.shape).astype(dtype) for p in gpt.parameters()]
    _compare(forward, gpt, [_rng(2).standard_normal((2, 6, 8)).astype(dtype)], before=held)


def test_a_weight_used_three_times_sums_its_terms_in_the_plain_order():
    # Two-term sums are the same bits in either order (IEEE addition is
    # commutative); three terms are not: (a + b) + c != (a + c) + b in
    # general. The plain backward reaches the last use first, so the weight
    # receives t3, then t2, then t1, and sums (t3 + t2) + t1.
    weight = nn.Parameter(_rng(13).standard_normal((5, 5)).astype(np.float32))
    x = _rng().standard_normal((7, 5)).astype(np.float32)
    g = _rng(1).standard_normal((7, 5)).astype(np.float32)

    def forward(t):
        return F.linear(F.linear(F.linear(t, weight), weight), weight)

    _compare(forward, [weight], [x], g)
    w = weight.data
    y1 = x @ w.T
    y2 = y1 @ w.T
    g2 = g @ w
    g1 = g2 @ w
    t3, t2, t1 = g.T @ y2, g2.T @ y1, g1.T @ x
    assert np.array_equal(weight.grad, (t3 + t2) + t1)
    assert not np.array_equal((t3 + t2) + t1, (t1 + t2) + t3)  # the order is seen


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_recomputed_segment_replays_its_forward_in_each_half(dtype):
    nn.init.manual_seed(14)
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    model = nn.CheckpointedSequential(model.to(dtype), every=2)
    _compare(lambda t: (model(t) ** 2).sum(), model,
             [_rng().standard_normal((4, 6)).astype(dtype)])


def test_gradient_accumulation_across_micro_batches():
    nn.init.manual_seed(15)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
    params = _params(model)
    batches = [_rng(seed).standard_normal((3, 5)).astype(np.float32) for seed in range(3)]
    gradients = [_rng(10 + seed).standard_normal((3, 2)).astype(np.float32) for seed in range(3)]
    held = [_rng(20).standard_normal(p.shape).astype(np.float32) for p in params]

    def start():
        for p, value in zip(params, held):
            p.grad = value.copy()

    start()
    plain_x = []
    for batch, g in zip(batches, gradients):
        x = Tensor(batch, requires_grad=True)
        x.grad = np.ones_like(batch)  # an input's .grad accumulates in I
        model(x).backward(g)
        plain_x.append(x.grad)
    plain = [p.grad.copy() for p in params]

    # A zero-bubble order: every I first, then the W's in micro-batch order.
    start()
    pendings = []
    for batch, g, theirs in zip(batches, gradients, plain_x):
        x = Tensor(batch, requires_grad=True)
        x.grad = np.ones_like(batch)
        pendings.append(backward_input(model(x), g, inputs=x))
        assert np.array_equal(x.grad, theirs)
    assert all(np.array_equal(p.grad, value) for p, value in zip(params, held))
    for pending in pendings:
        pending.backward_weight()
    assert all(np.array_equal(p.grad, value) for p, value in zip(params, plain))


# --------------------------------------------------------------------------
# What I must not do


class _Counted(np.ndarray):
    """An array whose every ufunc call is passed on as a plain array's, and
    whose matmuls are logged: (output shape, flops)."""

    log = []

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain = [i.view(np.ndarray) if isinstance(i, _Counted) else i for i in inputs]
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, _Counted) else o for o in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        if ufunc is np.matmul and method == "__call__":
            a, b = plain[0], plain[1]
            _Counted.log.append((result.shape, 2 * a.size * b.shape[-1]))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return result.view(_Counted) if isinstance(result, np.ndarray) else result


def _gemms(weight_shapes):
    """(dX GEMMs, dW GEMMs, dW flops) logged since the last reset."""
    dw = [flops for shape, flops in _Counted.log if shape in weight_shapes]
    dx = [flops for shape, flops in _Counted.log if shape not in weight_shapes]
    _Counted.log.clear()
    return len(dx), len(dw), sum(dw)


def test_the_input_half_does_no_weight_gemm_and_the_weight_half_no_input_gemm():
    sizes = [9, 7, 5, 3]  # distinct, so a product's shape tells which it is
    layers = [nn.Linear(a, b, rng=16 + i) for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
    for layer in layers:
        layer.weight.data = layer.weight.data.view(_Counted)
    weight_shapes = {layer.weight.shape for layer in layers}
    model = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2])
    batch = _rng().standard_normal((4, 9)).astype(np.float32).view(_Counted)
    g = _rng(1).standard_normal((4, 3)).astype(np.float32)

    out = model(Tensor(batch, requires_grad=True))
    _Counted.log.clear()
    out.backward(g)
    plain = _gemms(weight_shapes)
    assert plain[:2] == (3, 3)

    x = Tensor(batch, requires_grad=True)
    out = model(x)
    _Counted.log.clear()
    pending = backward_input(out, g, inputs=[x])
    assert _gemms(weight_shapes) == (3, 0, 0)          # I: the three dX, no dW
    pending.backward_weight()
    assert _gemms(weight_shapes) == (0, 3, plain[2])   # W: the three dW, no dX
    assert plain[2] == 2 * 4 * (9 * 7 + 7 * 5 + 5 * 3)


def test_a_weight_gradient_asked_for_in_the_input_half_would_raise():
    phase = {"now": None}
    x_data = _rng().standard_normal((3, 4))
    w_data = _rng(1).standard_normal((4, 2))

    def tripwire_product(x, w, marked):
        def backward(g):
            if w.requires_grad and phase["now"] == "I":
                raise AssertionError("the weight gradient was computed in the input half")
            return (g @ w.data.T if x.requires_grad else None,
                    x.data.T @ g if w.requires_grad else None)

        if marked:
            backward = _split_by_requires_grad(backward)
        return Tensor._make(x.data @ w.data, (x, w), backward, "tripwire")

    w = Tensor(w_data, requires_grad=True)
    x = Tensor(x_data, requires_grad=True)
    out = (tripwire_product(x, w, marked=True) ** 2).sum()
    phase["now"] = "I"
    pending = backward_input(out, inputs=[x])
    assert w.grad is None
    phase["now"] = "W"
    pending.backward_weight()
    expected = x_data.T @ (2 * (x_data @ w_data))
    np.testing.assert_allclose(w.grad, expected, rtol=1e-12)

    # Unmarked, the same backward is called whole in I (and so trips).
    x = Tensor(x_data, requires_grad=True)
    out = (tripwire_product(x, w, marked=False) ** 2).sum()
    phase["now"] = "I"
    with pytest.raises(AssertionError, match="input half"):
        backward_input(out, inputs=[x])


def test_an_unmarked_split_node_computes_in_i_and_hands_on_in_w():
    scale = nn.Parameter(np.array([1.5, -2.0, 0.5], np.float32))
    x = Tensor(_rng().standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    pending = backward_input(((x * scale) ** 2).sum(), inputs=[x])
    assert scale.grad is None
    assert pending.nbytes == 3 * 4  # the (3,) gradient of scale, nothing else
    pending.backward_weight()
    np.testing.assert_allclose(scale.grad, (2 * x.data ** 2 * scale.data).sum(axis=0), rtol=1e-6)


def test_a_marked_backward_that_ignores_the_mark_is_named():
    x = Tensor(np.ones((2, 2)), requires_grad=True)
    w = Tensor(np.ones((2, 2)), requires_grad=True)

    @_split_by_requires_grad
    def careless(g):
        return g @ w.data.T, x.data.T @ g

    out = Tensor._make(x.data @ w.data, (x, w), careless, "careless")
    with pytest.raises(RuntimeError, match="careless.*requires_grad was off"):
        backward_input(out.sum(), inputs=[x])
    assert w.requires_grad  # put back after the failed call


# --------------------------------------------------------------------------
# What W keeps


def _linear_stack(dtype, sizes=(6, 5, 4, 3)):
    nn.init.manual_seed(17)
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nbytes_of_a_linear_stack_is_each_layers_input_and_output_gradient(dtype):
    sizes, batch = (6, 5, 4, 3), 7
    model = _linear_stack(dtype, sizes)
    x = Tensor(_rng().standard_normal((batch, 6)).astype(dtype), requires_grad=True)
    g = np.ones((batch, 3), dtype)
    pending = backward_input(model(x), g, inputs=[x])
    itemsize = np.dtype(dtype).itemsize
    # Per Linear: its input x (batch x in) for dW = dY^T x, and dY (batch x out).
    expected = sum(batch * (a + b) * itemsize for a, b in zip(sizes, sizes[1:]))
    assert pending.nbytes == expected
    ledger = memory.Ledger(model)
    assert ledger.measure(weights_pending=pending)["activations"] == expected
    assert ledger.sample("between I and W", weights_pending=[pending]).bytes["activations"] == expected
    pending.backward_weight()
    assert pending.nbytes == 0 and ledger.measure(weights_pending=pending)["activations"] == 0


def test_a_convolution_keeps_its_columns_its_input_and_its_output_gradient():
    conv = nn.Conv2d(3, 4, 3, padding=1, rng=22)
    x = Tensor(_rng().standard_normal((2, 3, 5, 5)).astype(np.float32), requires_grad=True)
    pending = backward_input(conv(x), np.ones((2, 4, 5, 5), np.float32), inputs=[x])
    # im2col's (C*KH*KW + 1 for the bias riding in the GEMM, N*OH*OW)
    # columns for dW; the input, which the backward holds for its shape and
    # the input gradient; dY, (N, OC, OH, OW).
    columns = (3 * 9 + 1) * 2 * 25
    assert pending.nbytes == 4 * (columns + 2 * 3 * 25 + 2 * 4 * 25)


def test_i_releases_what_only_the_input_gradient_needed():
    import gc
    import weakref

    model = _linear_stack(np.float32)
    x = Tensor(_rng().standard_normal((3, 6)).astype(np.float32), requires_grad=True)
    pre_activation = model[0](x)
    out = model[2:](model[1](pre_activation)).sum()
    gone = weakref.ref(pre_activation)
    del pre_activation
    pending = backward_input(out, inputs=[x])
    gc.collect()
    assert gone() is None  # the first Linear's output: ReLU's, released by I
    assert out._freed
    pending.backward_weight()


@pytest.mark.parametrize("with_input", [True, False])
def test_the_callers_gradient_buffer_may_be_reused_after_i(with_input):
    layer = nn.Linear(4, 3, rng=20)
    x_data = _rng().standard_normal((5, 4)).astype(np.float32)
    received = _rng(1).standard_normal((5, 3)).astype(np.float32)
    layer(Tensor(x_data)).backward(received.copy())
    expected = layer.weight.grad.copy()
    _clear(layer.parameters())
    x = Tensor(x_data, requires_grad=with_input)
    pending = backward_input(layer(x), received, inputs=[x] if with_input else [])
    received[...] = 0  # the next micro-batch received into the same buffer
    pending.backward_weight()
    assert np.array_equal(layer.weight.grad, expected)


# --------------------------------------------------------------------------
# Hooks, retain_graph, errors


def test_hooks_fire_in_i_for_inputs_and_in_w_for_parameters_in_the_plain_order():
    def run(split):
        nn.init.manual_seed(21)
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        calls = []
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(lambda t, name=name: calls.append(name))
            p.register_hook(lambda g, name=name: calls.append("hook " + name))
        x = Tensor(_rng().standard_normal((3, 4)).astype(np.float32), requires_grad=True)
        x.register_hook(lambda g: calls.append("hook x") or g * 2)   # replaces x's gradient
        x.register_post_accumulate_grad_hook(lambda t: calls.append("x"))
        middle = model[:3](x).retain_grad()
        out = model[3:](middle).sum()
        if not split:
            out.backward()
            return calls, x.grad, middle.grad
        pending = backward_input(out, inputs=[x])
        in_i = list(calls)
        pending.backward_weight()
        return (in_i, calls[len(in_i):]), x.grad, middle.grad

    plain, plain_x, plain_middle = run(split=False)
    (in_i, in_w), x_grad, middle_grad = run(split=True)
    assert in_i == ["hook x", "x"]
    assert in_w == [call for call in plain if call not in ("hook x", "x")]
    assert np.array_equal(x_grad, plain_x) and np.array_equal(middle_grad, plain_middle)


def test_retain_graph_keeps_the_graph_for_another_backward():
    model = _linear_stack(np.float64)
    x = Tensor(_rng().standard_normal((3, 6)), requires_grad=True)
    out = model(x).sum()
    backward_input(out, inputs=[x], retain_graph=True).backward_weight()
    once = [p.grad.copy() for p in model.parameters()]
    out.backward()
    assert all(np.allclose(p.grad, 2 * value) for p, value in zip(model.parameters(), once))


def test_without_retain_graph_w_frees_the_graph_and_runs_once():
    model = _linear_stack(np.float64)
    x = Tensor(_rng().standard_normal((3, 6)), requires_grad=True)
    out = model(x).sum()
    pending = backward_input(out, inputs=[x])
    pending.backward_weight()
    with pytest.raises(RuntimeError, match="already freed"):
        out.backward()
    with pytest.raises(RuntimeError, match=r"^backward_weight\(\) was already called"):
        pending.backward_weight()


def test_w_after_a_backward_freed_its_graph_is_refused_before_any_work():
    model = _linear_stack(np.float64)
    x = Tensor(_rng().standard_normal((3, 6)), requires_grad=True)
    out = model(x).sum()
    pending = backward_input(out, inputs=[x], retain_graph=True)
    out.backward()  # frees the graph, and fills every .grad
    grads = [p.grad.copy() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"^backward_weight\(\): a 'linear' node .* was freed"):
        pending.backward_weight()
    assert all(np.array_equal(p.grad, value) for p, value in zip(model.parameters(), grads))


def _message(call):
    with pytest.raises(Exception) as caught:
        call()
    return type(caught.value), str(caught.value)


def test_the_errors_of_backward_are_the_same():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    with no_grad():
        untracked = (x * 2).sum()
    for output, gradient in [(untracked, None), (Tensor(np.ones(3)), None),
                             (x * 2, None), (x * 2, np.ones((3, 2)))]:
        split = _message(lambda o=output, g=gradient: backward_input(o, g, inputs=[x]))
        assert split == _message(lambda o=output, g=gradient: o.backward(g))
    out = (x * 2).sum()
    out.backward()
    assert _message(lambda: backward_input(out, inputs=[x])) == _message(lambda: out.backward())


def test_wrong_inputs_are_named_in_one_line():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    h = x * 2
    out = (h * 3).sum()
    stray = Tensor(np.ones(3), requires_grad=True)
    cases = [
        ([h], ValueError, r"inputs\[0\] \(shape \(2, 3\)\) is not a leaf but the output of 'mul'"),
        ([x, Tensor(np.ones(2))], ValueError, r"inputs\[1\] .* does not require grad.*inputs=\[\]"),
        ([stray], ValueError, r"inputs\[0\] \(shape \(3,\)\) is not in the graph of the output"),
        ([np.ones(3)], TypeError, r"inputs\[0\] must be a Tensor"),
    ]
    for inputs, error, pattern in cases:
        with pytest.raises(error, match=pattern) as caught:
            backward_input(out, inputs=inputs)
        assert "\n" not in str(caught.value)
    assert x.grad is None


def test_a_first_stage_passes_no_input_and_w_does_the_whole_backward():
    model = _linear_stack(np.float32)
    batch = _rng().standard_normal((3, 6)).astype(np.float32)
    model(Tensor(batch)).sum().backward()
    plain = [p.grad.copy() for p in model.parameters()]
    _clear(model.parameters())
    pending = backward_input(model(Tensor(batch)).sum(), inputs=[])
    assert all(p.grad is None for p in model.parameters())
    assert pending.nbytes > 0
    pending.backward_weight()
    assert all(np.array_equal(p.grad, value) for p, value in zip(model.parameters(), plain))
    assert re.match(r"WeightGradients\(done\)", repr(pending))
