"""Module and Tensor hooks, held to what torch documents for them
(``torch.nn.Module.register_forward_pre_hook`` / ``register_forward_hook`` /
``register_full_backward_pre_hook``, ``torch.Tensor.register_hook``,
``torch.utils.hooks.RemovableHandle``): who is called, with what, in which
order, what a returned value replaces, and that ``remove()`` takes a hook out."""

import numpy as np
import pytest

from minidist import Tensor, nn


def _linear():
    layer = nn.Linear(3, 2)
    layer.weight.data[...] = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    layer.bias.data[...] = 0.5
    return layer


def _x():
    return Tensor(np.array([[1.0, -2.0, 3.0]], np.float32), requires_grad=True)


def test_forward_hooks_run_around_forward_in_registration_order_with_the_arguments():
    layer, calls = _linear(), []
    x = _x()
    layer.register_forward_pre_hook(lambda m, args: calls.append(("pre1", m, args)))
    layer.register_forward_pre_hook(lambda m, args: calls.append(("pre2", m, args)))
    layer.register_forward_hook(lambda m, args, out: calls.append(("post1", m, args, out)))
    layer.register_forward_hook(lambda m, args, out: calls.append(("post2", m, args, out)))
    out = layer(x)
    assert [c[0] for c in calls] == ["pre1", "pre2", "post1", "post2"]
    for call in calls:
        assert call[1] is layer
        assert isinstance(call[2], tuple) and len(call[2]) == 1 and call[2][0] is x
    assert calls[2][3] is out and calls[3][3] is out


def test_prepend_puts_a_hook_first():
    layer, calls = _linear(), []
    layer.register_forward_pre_hook(lambda m, args: calls.append("a"))
    layer.register_forward_pre_hook(lambda m, args: calls.append("b"), prepend=True)
    layer.register_forward_hook(lambda m, args, out: calls.append("c"))
    layer.register_forward_hook(lambda m, args, out: calls.append("d"), prepend=True)
    layer(_x())
    assert calls == ["b", "a", "d", "c"]


def test_a_pre_hook_result_replaces_the_arguments_and_a_single_value_becomes_a_tuple():
    layer, seen = _linear(), []
    doubled = Tensor(np.full((1, 3), 2.0, np.float32))
    layer.register_forward_pre_hook(lambda m, args: doubled)        # not a tuple
    layer.register_forward_pre_hook(lambda m, args: seen.append(args))
    layer.register_forward_hook(lambda m, args, out: seen.append(args))
    out = layer(_x())
    assert seen[0] == (doubled,) and seen[1] == (doubled,)
    np.testing.assert_allclose(out.data, doubled.data @ layer.weight.data.T + layer.bias.data)


def test_a_forward_hook_result_replaces_the_output_for_the_next_hook_and_the_caller():
    layer, seen = _linear(), []
    layer.register_forward_hook(lambda m, args, out: out * 2)
    layer.register_forward_hook(lambda m, args, out: seen.append(out.data.copy()))
    plain = _linear()(_x()).data
    out = layer(_x())
    np.testing.assert_allclose(out.data, 2 * plain)
    np.testing.assert_allclose(seen[0], 2 * plain)


def test_with_kwargs_hooks_see_and_may_replace_the_keyword_arguments():
    class Scale(nn.Module):
        def forward(self, x, factor=1.0):
            return x * factor

    module, seen = Scale(), []
    module.register_forward_pre_hook(lambda m, args, kwargs: (args, {"factor": 3.0}),
                                     with_kwargs=True)
    module.register_forward_hook(lambda m, args, kwargs, out: seen.append(dict(kwargs)),
                                 with_kwargs=True)
    out = module(Tensor(np.ones(2, np.float32)), factor=5.0)
    np.testing.assert_allclose(out.data, 3.0)
    assert seen == [{"factor": 3.0}]
    module.register_forward_pre_hook(lambda m, args, kwargs: "not a pair", with_kwargs=True)
    with pytest.raises(RuntimeError, match=r"\(args, kwargs\)"):
        module(Tensor(np.ones(2, np.float32)))


def test_remove_takes_the_hook_out_and_a_handle_is_a_context_manager():
    layer, calls = _linear(), []
    handle = layer.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    other = layer.register_forward_hook(lambda m, args, out: calls.append("post"))
    layer(_x())
    handle.remove()
    handle.remove()                                   # twice is harmless, as torch's
    layer(_x())
    assert calls == ["pre", "post", "post"]
    other.remove()
    with layer.register_forward_hook(lambda m, args, out: calls.append("with")):
        layer(_x())
    layer(_x())
    assert calls == ["pre", "post", "post", "with"]
    assert not layer._forward_pre_hooks and not layer._forward_hooks


def test_a_hook_may_remove_itself_while_the_hooks_run():
    layer, calls = _linear(), []
    handles = []
    handles.append(layer.register_forward_pre_hook(
        lambda m, args: (calls.append("once"), handles[0].remove())[0]))
    layer.register_forward_pre_hook(lambda m, args: calls.append("always"))
    layer(_x())
    layer(_x())
    assert calls == ["once", "always", "always"]


def test_hooks_of_a_child_run_when_the_parent_calls_it():
    model = nn.Sequential(_linear(), nn.ReLU())
    calls = []
    model[0].register_forward_hook(lambda m, args, out: calls.append(type(m).__name__))
    model.register_forward_hook(lambda m, args, out: calls.append(type(m).__name__))
    model(_x())
    assert calls == ["Linear", "Sequential"]


# --------------------------------------------------------------------------- Tensor.register_hook


def test_a_tensor_hook_sees_the_complete_gradient_and_may_replace_it():
    x = _x()
    y = x * 3
    seen = []
    y.register_hook(lambda g: seen.append(g.copy()))
    y.register_hook(lambda g: g * 10)                # replaces what flows on
    (y.sum() + y.sum()).backward()                   # two consumers: called once, summed
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 2.0)
    np.testing.assert_allclose(x.grad, 2.0 * 10 * 3)


def test_a_leaf_hook_runs_before_accumulation_and_a_removed_one_not_at_all():
    x = _x()
    order = []
    handle = x.register_hook(lambda g: order.append(("hook", x.grad)) or g * 2)
    x.register_post_accumulate_grad_hook(lambda t: order.append(("accumulated", t.grad.copy())))
    (x * 1).sum().backward()
    assert order[0] == ("hook", None)                # before .grad exists
    np.testing.assert_allclose(order[1][1], 2.0)     # the hook's result is what accumulates
    handle.remove()
    x.grad = None
    (x * 1).sum().backward()
    np.testing.assert_allclose(x.grad, 1.0)


def test_retain_grad_keeps_the_gradient_as_the_hooks_leave_it():
    x = _x()
    y = x * 2
    y.retain_grad()
    y.register_hook(lambda g: g + 1)
    y.sum().backward()
    np.testing.assert_allclose(y.grad, 2.0)
    np.testing.assert_allclose(x.grad, 4.0)


def test_a_hook_on_a_tensor_without_gradient_is_refused():
    with pytest.raises(RuntimeError, match="does not require a gradient"):
        Tensor(np.ones(2, np.float32)).register_hook(lambda g: None)


def test_a_hook_result_is_not_overwritten_by_an_in_place_backward():
    # ReLU's backward may mask an owned gradient in place; a hook's result is
    # the hook's, so it must come out untouched.
    x = Tensor(np.array([-1.0, 2.0], np.float32), requires_grad=True)
    y = x * 1
    h = y.relu()
    kept = []

    def keep(g):
        kept.append(np.ones_like(g))
        return kept[0]

    h.register_hook(keep)
    (h.sum() + h.sum()).backward()                   # a sum: the engine owns it
    np.testing.assert_allclose(kept[0], 1.0)
    np.testing.assert_allclose(x.grad, [0.0, 1.0])



# --------------------------------------------------------------------------- full backward pre-hook


def test_a_full_backward_pre_hook_gets_grad_output_before_the_module_backward():
    layer = _linear()
    x = _x()
    seen = []

    def hook(module, grad_output):
        seen.append((module, grad_output, layer.weight.grad))
        return (grad_output[0] * 2,)

    handle = layer.register_full_backward_pre_hook(hook)
    layer(x).sum().backward()
    module, grad_output, weight_grad_then = seen[0]
    assert module is layer and isinstance(grad_output, tuple) and len(grad_output) == 1
    np.testing.assert_allclose(grad_output[0], 1.0)
    assert weight_grad_then is None                  # the layer's backward had not run
    np.testing.assert_allclose(x.grad, 2 * layer.weight.data.sum(axis=0, keepdims=True))
    handle.remove()
    x.grad = None
    layer(x).sum().backward()
    np.testing.assert_allclose(x.grad, layer.weight.data.sum(axis=0, keepdims=True))
    assert len(seen) == 1
