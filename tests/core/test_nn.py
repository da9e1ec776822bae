"""minidist.nn: the Module system (registration order, state dicts and their
errors, train/eval, repr), the layers against the functional ops and against
finite differences, deterministic initialisation, and short training runs."""

from collections import OrderedDict

import numpy as np
import pytest
from nn_reference import check_grad, conv2d_naive

from minidist import Tensor, nn, no_grad, optim
from minidist.nn import functional as F

# Values through BLAS, compared exactly or to a rounding: run again on Haswell kernels by .ci/run.
pytestmark = pytest.mark.blas_kernel


def mlp():
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(6, 3)
        self.scale = nn.Parameter(np.ones(3, np.float32))

    def forward(self, x):
        return self.fc2(self.drop(self.bn(self.fc1(x)).relu())) * self.scale


# --------------------------------------------------------------------------
# Registration and walking the tree


def test_parameters_come_in_registration_order_with_dotted_names():
    model = nn.Sequential(Block(), nn.Linear(3, 2))
    names = [name for name, _ in model.named_parameters()]
    assert names == [
        "0.scale", "0.fc1.weight", "0.fc1.bias", "0.bn.weight", "0.bn.bias",
        "0.fc2.weight", "0.fc2.bias", "1.weight", "1.bias",
    ]
    assert [id(p) for p in model.parameters()] == [id(p) for _, p in model.named_parameters()]
    # Stable: the same order every call and in every identically built model.
    assert names == [name for name, _ in model.named_parameters()]
    assert names == [name for name, _ in nn.Sequential(Block(), nn.Linear(3, 2)).named_parameters()]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())


def test_buffers_are_state_but_not_parameters():
    block = Block()
    assert [name for name, _ in block.named_buffers()] == [
        "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
    ]
    assert not any(b is p for b in block.buffers() for p in block.parameters())
    assert list(block.state_dict()) == [
        "scale", "fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "bn.running_mean",
        "bn.running_var", "bn.num_batches_tracked", "fc2.weight", "fc2.bias",
    ]
    block.register_buffer("scratch", np.zeros(2), persistent=False)
    assert "scratch" not in block.state_dict() and any(n == "scratch" for n, _ in block.named_buffers())


def test_a_shared_parameter_is_listed_once_and_modules_and_children_walk_the_tree():
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    assert len(list(model.parameters())) == 2
    assert [name for name, _ in model.named_modules()] == ["", "0", "1"]
    assert [type(m).__name__ for m in model.children()] == ["Linear", "ReLU", "Linear"]
    assert [type(m).__name__ for m in model.modules()] == ["Sequential", "Linear", "ReLU"]


def test_num_parameters():
    assert mlp().num_parameters() == 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    model[1].weight.requires_grad = False
    assert model.num_parameters() == 8 + 4 and model.num_parameters(trainable_only=True) == 8 + 2


def test_assignment_rules_and_forgetting_super_init():
    layer = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="is a parameter"):
        layer.weight = Tensor(np.zeros((2, 2), np.float32))
    layer.bias = None
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    assert layer(Tensor(np.ones((1, 2), np.float32))).shape == (1, 2)

    class Forgetful(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Forgetful()
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(1)


def test_module_list_registers_its_items():
    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    tower = Tower()
    assert len(tower.layers) == 3 and tower.layers[-1] is list(tower.layers)[2]
    assert [name for name, _ in tower.named_parameters()][:2] == ["layers.0.weight", "layers.0.bias"]
    tower.layers.append(nn.Linear(2, 2))
    assert len(list(tower.parameters())) == 8
    assert tower(Tensor(np.ones((1, 2), np.float32))).shape == (1, 2)


def test_sequential_is_indexable_sliceable_and_iterable():
    model = mlp()
    assert len(model) == 5 and isinstance(model[0], nn.Linear) and model[-1] is model[4]
    head = model[3:]
    assert isinstance(head, nn.Sequential) and len(head) == 2 and head[1] is model[4]
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    with pytest.raises(IndexError, match="out of range"):
        model[5]
    named = nn.Sequential(OrderedDict(first=nn.Linear(2, 3), act=nn.Tanh()))
    assert [name for name, _ in named.named_parameters()] == ["first.weight", "first.bias"]
    with pytest.raises(TypeError, match="nn.ReLU"):
        nn.Sequential(nn.Linear(2, 2), F.relu)


def test_repr_reads_like_pytorch():
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.BatchNorm2d(16),
        nn.Flatten(), nn.Dropout(0.25), nn.Linear(16 * 14 * 14, 10, bias=False),
    )
    assert repr(model) == (
        "Sequential(\n"
        "  (0): Conv2d(1, 16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
        "  (1): ReLU()\n"
        "  (2): MaxPool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0))\n"
        "  (3): BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)\n"
        "  (4): Flatten(start_dim=1, end_dim=-1)\n"
        "  (5): Dropout(p=0.25)\n"
        "  (6): Linear(in_features=3136, out_features=10, bias=False)\n"
        ")"
    )
    assert repr(Block()).splitlines()[1] == "  (fc1): Linear(in_features=4, out_features=6, bias=True)"


# --------------------------------------------------------------------------
# Modes and gradients


def test_train_and_eval_propagate_to_every_module():
    model = nn.Sequential(Block(), nn.Sequential(nn.Dropout(), nn.Linear(3, 3)))
    assert all(m.training for m in model.modules())
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())
    model[1].train(False)
    assert model.training and not model[1][0].training
    with pytest.raises(TypeError, match="bool"):
        model.train("no")


def test_zero_grad_drops_or_zeroes():
    model = nn.Linear(3, 2)
    model(Tensor(np.ones((4, 3), np.float32))).sum().backward()
    grad = model.weight.grad
    model.zero_grad(set_to_none=False)
    assert model.weight.grad is grad and not grad.any()
    model.zero_grad()
    assert model.weight.grad is None and model.bias.grad is None


def test_to_float64_for_gradient_checks():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(np.float64)
    assert all(p.dtype == np.float64 for p in model.parameters())
    assert model[1].running_mean.dtype == np.float64
    assert model[1].num_batches_tracked.dtype == np.int64


# --------------------------------------------------------------------------
# State dicts


def test_state_dict_roundtrip_copies_and_loads_in_place():
    nn.init.manual_seed(1)
    source = nn.Sequential(Block(), nn.Linear(3, 2))
    source.train()
    source(Tensor(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)))  # move BN stats
    saved = source.state_dict()
    assert all(isinstance(v, np.ndarray) for v in saved.values())
    assert saved["0.bn.num_batches_tracked"] == 1

    # Copies: changing the model does not change the snapshot, nor vice versa.
    source[1].weight.data += 1
    assert not np.array_equal(saved["1.weight"], source[1].weight.data)
    saved_again = source.state_dict()
    saved_again["1.weight"][...] = 0
    assert source[1].weight.data.any()

    nn.init.manual_seed(2)
    target = nn.Sequential(Block(), nn.Linear(3, 2))
    weight_array = target[1].weight.data
    result = target.load_state_dict(saved)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert target[1].weight.data is weight_array  # in place: views of it stay valid
    for name, value in target.state_dict().items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)
    x = Tensor(np.ones((5, 4), np.float32))
    source.load_state_dict(saved)
    source.eval()
    target.eval()
    np.testing.assert_array_equal(source(x).data, target(x).data)


def test_load_state_dict_shape_mismatch_names_the_key_and_both_shapes():
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))
    saved = nn.Sequential(nn.Linear(783, 512), nn.ReLU(), nn.Linear(512, 10)).state_dict()
    before = model[0].weight.data.copy()
    with pytest.raises(RuntimeError) as error:
        model.load_state_dict(saved)
    message = str(error.value)
    assert "'0.weight'" in message and "(512, 783)" in message and "(512, 784)" in message
    assert "same layers and sizes" in message
    np.testing.assert_array_equal(model[0].weight.data, before)  # nothing was copied
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.load_state_dict(saved, strict=False)


def test_load_state_dict_missing_and_unexpected_keys():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    saved = model.state_dict()
    del saved["1.bias"]
    saved["2.weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(RuntimeError) as error:
        model.load_state_dict(saved)
    message = str(error.value)
    assert "missing key '1.bias'" in message and "(2,)" in message
    assert "unexpected key '2.weight'" in message and "(2, 2)" in message
    assert "strict=False" in message
    result = model.load_state_dict(saved, strict=False)
    assert result.missing_keys == ["1.bias"] and result.unexpected_keys == ["2.weight"]


def test_load_state_dict_casts_dtype_and_accepts_tensors():
    model = nn.Linear(2, 2)
    model.load_state_dict({"weight": np.eye(2), "bias": Tensor(np.array([1.0, 2.0]))})
    assert model.weight.dtype == np.float32
    np.testing.assert_array_equal(model.weight.data, np.eye(2))
    np.testing.assert_array_equal(model.bias.data, [1, 2])


# --------------------------------------------------------------------------
# Initialisation and seeding


def test_manual_seed_makes_models_identical_and_rng_overrides_it():
    nn.init.manual_seed(42)
    a = cnn()
    nn.init.manual_seed(42)
    b = cnn()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    c = cnn()  # the generator has moved on
    assert not np.array_equal(a[0].weight.data, c[0].weight.data)
    d, e = nn.Linear(5, 5, rng=3), nn.Linear(5, 5, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(d.weight.data, e.weight.data)
    np.testing.assert_array_equal(d.bias.data, e.bias.data)
    with pytest.raises(TypeError, match="Generator"):
        nn.Linear(2, 2, rng="seed")


def test_layer_initialisation_follows_pytorch_bounds():
    nn.init.manual_seed(0)
    linear = nn.Linear(400, 300)
    conv = nn.Conv2d(8, 16, 3)
    for layer, fan_in in ((linear, 400), (conv, 8 * 9)):
        bound = 1 / np.sqrt(fan_in)
        for param in (layer.weight, layer.bias):
            assert np.abs(param.data).max() <= bound
        assert np.abs(layer.weight.data).max() > 0.95 * bound  # uniform over the whole range
        assert layer.weight.dtype == np.float32
    assert abs(linear.weight.data.std() - 1 / np.sqrt(3 * 400)) < 0.01 / np.sqrt(400)


def test_initialisers():
    tensor = nn.Parameter(np.empty((200, 100), np.float32))
    nn.init.kaiming_uniform_(tensor, nonlinearity="relu", rng=0)
    bound = np.sqrt(2) * np.sqrt(3 / 100)
    assert np.abs(tensor.data).max() <= bound and abs(tensor.data.std() - bound / np.sqrt(3)) < 0.01
    nn.init.xavier_uniform_(tensor, rng=0)
    assert np.abs(tensor.data).max() <= np.sqrt(6 / 300)
    nn.init.kaiming_normal_(tensor, mode="fan_out", nonlinearity="relu", rng=0)
    assert abs(tensor.data.std() - np.sqrt(2 / 200)) < 0.005
    nn.init.zeros_(tensor)
    assert not tensor.data.any()
    nn.init.ones_(tensor)
    assert (tensor.data == 1).all()
    assert nn.init.calculate_fans((16, 8, 3, 3)) == (72, 144)
    assert nn.init.calculate_gain("tanh") == pytest.approx(5 / 3)
    with pytest.raises(ValueError, match="at least 2 axes"):
        nn.init.xavier_uniform_(nn.Parameter(np.zeros(3, np.float32)))


# --------------------------------------------------------------------------
# Layers


def test_layers_call_their_functional_op():
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    conv = nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=1)
    np.testing.assert_allclose(
        conv(x).data,
        conv2d_naive(x.data, conv.weight.data, conv.bias.data, (2, 1), (1, 1)),
        rtol=1e-4, atol=1e-5,
    )
    np.testing.assert_array_equal(nn.MaxPool2d(3, 2, 1)(x).data, F.max_pool2d(x, 3, 2, 1).data)
    np.testing.assert_array_equal(nn.AvgPool2d(2)(x).data, F.avg_pool2d(x, 2).data)
    np.testing.assert_array_equal(nn.GELU("tanh")(x).data, F.gelu(x, "tanh").data)
    np.testing.assert_array_equal(nn.Softmax(1)(x).data, F.softmax(x, 1).data)
    assert nn.Flatten()(x).shape == (2, 192) and nn.Identity()(x) is x
    assert conv(x).shape == (2, 4, 4, 9)


def test_linear_and_conv_layer_gradients_in_float64():
    nn.init.manual_seed(0)
    linear = nn.Linear(5, 3).to(np.float64)
    check_grad(lambda x, w, b: F.linear(x, w, b), np.random.default_rng(1).standard_normal((4, 5)),
               linear.weight.data, linear.bias.data)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.Tanh(), nn.AvgPool2d(2)).to(np.float64)
    x = Tensor(np.random.default_rng(2).standard_normal((2, 2, 4, 4)), requires_grad=True)
    model(x).sum().backward()
    numeric = np.zeros_like(x.data)
    for index in np.ndindex(x.shape):
        values = []
        for step in (1e-6, -1e-6):
            shifted = x.data.copy()
            shifted[index] += step
            values.append(model(Tensor(shifted)).data.sum())
        numeric[index] = (values[0] - values[1]) / 2e-6
    np.testing.assert_allclose(x.grad, numeric, rtol=1e-5, atol=1e-8)


def test_layer_shape_errors_say_what_to_do():
    with pytest.raises(ValueError, match=r"\(32, 100\).*in_features=784"):
        nn.Linear(784, 10)(Tensor(np.zeros((32, 100), np.float32)))
    with pytest.raises(ValueError, match=r"input has 3 channels.*in_channels=1"):
        nn.Conv2d(1, 4, 3)(Tensor(np.zeros((2, 3, 8, 8), np.float32)))
    with pytest.raises(ValueError, match=r"BatchNorm2d\(8\).*\(N, C, H, W\).*\(2, 4, 5, 5\)"):
        nn.BatchNorm2d(8)(Tensor(np.zeros((2, 4, 5, 5), np.float32)))
    with pytest.raises(ValueError, match=r"BatchNorm1d\(8\).*\(2, 8, 5, 5\)"):
        nn.BatchNorm1d(8)(Tensor(np.zeros((2, 8, 5, 5), np.float32)))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        nn.Dropout(-0.1)


def test_batch_norm_layer_running_statistics_and_modes():
    rng = np.random.default_rng(0)
    bn = nn.BatchNorm2d(3, momentum=0.5)
    batches = [rng.standard_normal((4, 3, 2, 2)).astype(np.float32) * 2 + 1 for _ in range(3)]
    expected_mean, expected_var = np.zeros(3), np.ones(3)
    for batch in batches:
        out = bn(Tensor(batch))
        np.testing.assert_allclose(out.data.mean(axis=(0, 2, 3)), 0, atol=1e-5)  # batch statistics
        expected_mean = 0.5 * expected_mean + 0.5 * batch.mean(axis=(0, 2, 3))
        expected_var = 0.5 * expected_var + 0.5 * batch.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(bn.running_mean.data, expected_mean, rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.data, expected_var, rtol=1e-5)
    assert int(bn.num_batches_tracked.data) == 3
    bn.eval()
    frozen = bn.running_mean.data.copy()
    out = bn(Tensor(batches[0]))
    reference = (batches[0] - expected_mean[None, :, None, None]) / np.sqrt(expected_var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(out.data, reference, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(bn.running_mean.data, frozen)
    assert int(bn.num_batches_tracked.data) == 3


def test_batch_norm_cumulative_average_and_no_running_stats():
    bn = nn.BatchNorm1d(2, momentum=None)
    batches = [np.random.default_rng(i).standard_normal((5, 2)).astype(np.float32) for i in range(4)]
    for batch in batches:
        bn(Tensor(batch))
    np.testing.assert_allclose(bn.running_mean.data, np.mean([b.mean(0) for b in batches], axis=0), rtol=1e-5)
    stateless = nn.BatchNorm1d(2, track_running_stats=False, affine=False).eval()
    assert stateless.num_parameters() == 0 and list(stateless.state_dict()) == []
    out = stateless(Tensor(batches[0]))
    np.testing.assert_allclose(out.data.mean(0), 0, atol=1e-5)  # batch statistics even in eval
    assert nn.BatchNorm1d(4)(Tensor(np.ones((2, 4, 3), np.float32))).shape == (2, 4, 3)


def test_dropout_layer_follows_the_mode_and_the_global_seed():
    x = Tensor(np.ones((50, 40), np.float32))
    drop = nn.Dropout(0.5)
    nn.init.manual_seed(5)
    first = drop(x).data
    nn.init.manual_seed(5)
    np.testing.assert_array_equal(drop(x).data, first)
    assert 0.4 < (first == 0).mean() < 0.6
    drop.eval()
    assert drop(x) is x
    seeded = nn.Dropout(0.5, rng=9)
    assert not np.array_equal(seeded(x).data, seeded(x).data)  # the generator advances


def test_loss_modules():
    logits = Tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    labels = np.array([0, 2, 1, 2])
    assert nn.CrossEntropyLoss()(logits, labels).item() == F.cross_entropy(logits, labels).item()
    assert nn.CrossEntropyLoss(reduction="sum")(logits, Tensor(labels)).item() == pytest.approx(
        F.cross_entropy(logits, labels, "sum").item()
    )
    assert nn.NLLLoss()(logits, labels).item() == F.nll_loss(logits, labels).item()
    assert nn.MSELoss()(logits, np.zeros((4, 3))).item() == pytest.approx((logits.data**2).mean())
    assert repr(nn.MSELoss(reduction="sum")) == "MSELoss(reduction='sum')"
    with pytest.raises(ValueError, match="reduction"):
        nn.CrossEntropyLoss(reduction="avg")


# --------------------------------------------------------------------------
# Training end to end


def test_an_mlp_learns_separable_blobs():
    rng = np.random.default_rng(0)
    centres = np.array([[-4.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    labels = rng.integers(0, 3, 300)
    x = (centres[labels] + rng.standard_normal((300, 2))).astype(np.float32)
    nn.init.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.GELU(), nn.BatchNorm1d(32), nn.Dropout(0.1), nn.Linear(32, 3))
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(60):
        loss = loss_fn(model(Tensor(x)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with no_grad():
        accuracy = (model(Tensor(x)).data.argmax(1) == labels).mean()
    assert accuracy > 0.97


def test_a_cnn_step_lowers_the_loss_and_keeps_float32():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 16)
    nn.init.manual_seed(0)
    model = cnn()
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(5):
        loss = nn.CrossEntropyLoss()(model(Tensor(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.grad.dtype == np.float32 and p.dtype == np.float32 for p in model.parameters())
