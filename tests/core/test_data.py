"""Tests of minidist.data: the bundled digits, IDX/MNIST files, synthetic sets, loader, sampler."""

from __future__ import annotations

import gzip
import hashlib
import struct
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.data import (
    ArrayDataset,
    DataLoader,
    DistributedSampler,
    IDXFormatError,
    digits_test_mask,
    load_digits,
    load_digits_raw,
    load_mnist,
    make_blobs,
    make_linear_regression,
    make_sparse_logistic,
    make_spirals,
    read_idx,
    write_idx,
)

# ---------------------------------------------------------------------------
# The bundled digits
# ---------------------------------------------------------------------------

# Pinned once when digits.npz was written; if these change, the data or the
# split changed, and every published number of the course with it.
DIGITS_SHA256 = "87ff0c9e40dc7e2c0e34e7257799c2e3f3aec1a016363bb11cad869ec428a826"
TEST_INDICES_SHA256 = "f169ac7f88a6056159147defc4b4a795976fc25cda8160bd80f79271c567a30a"


def test_digits_file_content_is_pinned():
    images, labels = load_digits_raw()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert labels.shape == (1797,) and labels.dtype == np.uint8
    assert images.max() == 16 and images.min() == 0
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest() == DIGITS_SHA256


def test_digits_shapes_dtypes_and_counts():
    x_train, y_train, x_test, y_test = load_digits()
    assert x_train.shape == (1442, 64) and x_test.shape == (355, 64)
    assert y_train.shape == (1442,) and y_test.shape == (355,)
    assert x_train.dtype == np.float32 and x_test.dtype == np.float32
    assert y_train.dtype == np.int64 and y_test.dtype == np.int64


def test_digits_pixels_scaled_to_unit_interval():
    x_train, _, x_test, _ = load_digits(dtype=np.float64)
    assert x_train.dtype == np.float64
    for pixels in (x_train, x_test):
        assert pixels.min() == 0.0 and pixels.max() == 1.0
        # Scaling is exactly a division by 16: the 17 levels survive.
        np.testing.assert_array_equal(pixels * 16, np.round(pixels * 16))


def test_digits_unflattened_are_one_channel_images_of_the_same_pixels():
    flat = load_digits(flatten=True)
    images = load_digits(flatten=False)
    assert images[0].shape == (1442, 1, 8, 8) and images[2].shape == (355, 1, 8, 8)
    np.testing.assert_array_equal(images[0].reshape(1442, 64), flat[0])
    np.testing.assert_array_equal(images[3], flat[3])


def test_digits_split_follows_the_documented_rule():
    _, labels = load_digits_raw()
    # The rule as the docstring states it, written as a plain loop.
    seen = {}
    expected = []
    for label in labels.tolist():
        count = seen.get(label, 0)
        expected.append(count % 5 == 4)
        seen[label] = count + 1
    mask = digits_test_mask(labels)
    np.testing.assert_array_equal(mask, np.array(expected))
    test_indices = np.flatnonzero(mask).astype("<i8")
    assert hashlib.sha256(test_indices.tobytes()).hexdigest() == TEST_INDICES_SHA256


def test_digits_split_is_a_partition_in_file_order():
    images, labels = load_digits_raw()
    x_train, y_train, x_test, y_test = load_digits(dtype=np.float64)
    mask = digits_test_mask(labels)
    np.testing.assert_array_equal(x_test * 16, images[mask].reshape(-1, 64))
    np.testing.assert_array_equal(x_train * 16, images[~mask].reshape(-1, 64))
    np.testing.assert_array_equal(y_test, labels[mask])
    np.testing.assert_array_equal(y_train, labels[~mask])


def test_digits_are_deterministic_and_fresh_on_every_call():
    first = load_digits()
    first[0][:] = -1.0  # a caller scribbling on its copy must not affect the next one
    second, third = load_digits(), load_digits()
    assert second[0].min() == 0.0
    for a, b in zip(second, third):
        np.testing.assert_array_equal(a, b)


def test_digits_every_class_in_test_and_balanced():
    _, y_train, _, y_test = load_digits()
    assert np.bincount(y_test, minlength=10).tolist() == [35, 36, 35, 36, 36, 36, 36, 35, 34, 36]
    train_counts = np.bincount(y_train, minlength=10)
    assert train_counts.min() >= 140
    # Each class is about a fifth in test, so the test class proportions
    # match the training ones within a percentage point.
    np.testing.assert_allclose(
        np.bincount(y_test) / len(y_test), train_counts / len(y_train), atol=0.01
    )


def test_digits_integer_dtype_is_refused_with_advice():
    with pytest.raises(TypeError, match="load_digits_raw"):
        load_digits(dtype=np.uint8)


def test_digits_licence_ships_beside_the_data():
    text = resources.files("minidist.data").joinpath("DIGITS_LICENSE.txt").read_text()
    for fact in ("Alpaydin", "Kaynak", "CC BY 4.0", "10.24432/C50P49", "scikit-learn", "BSD-3"):
        assert fact in text
    import minidist.data.digits as digits_module

    assert "CC BY 4.0" in digits_module.__doc__ and "Alpaydin" in digits_module.__doc__


# ---------------------------------------------------------------------------
# IDX files
# ---------------------------------------------------------------------------

IDX_CASES = [
    (0x08, np.uint8, ">u1"),
    (0x09, np.int8, ">i1"),
    (0x0B, np.int16, ">i2"),
    (0x0C, np.int32, ">i4"),
    (0x0D, np.float32, ">f4"),
    (0x0E, np.float64, ">f8"),
]


def _sample_array(dtype, shape=(3, 4, 5)):
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    values = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    if info is not None:
        # Reach both ends of the range, so byte order and sign both matter.
        values = values * 37 % (int(info.max) - int(info.min) + 1) + int(info.min)
    else:
        values = (values - 30.5) * 1e3 / 7
    return values.astype(dtype)


def _hand_written_idx(code, big_endian_type, array):
    """IDX bytes built from the format's definition, independently of write_idx."""
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    return header + array.astype(big_endian_type).tobytes()


@pytest.mark.parametrize("code, dtype, big_endian_type", IDX_CASES)
@pytest.mark.parametrize("compressed", [False, True])
def test_read_idx_reads_every_type_code(tmp_path, code, dtype, big_endian_type, compressed):
    array = _sample_array(dtype)
    raw = _hand_written_idx(code, big_endian_type, array)
    path = tmp_path / ("data.idx.gz" if compressed else "data.idx")
    path.write_bytes(gzip.compress(raw) if compressed else raw)
    result = read_idx(path)
    assert result.dtype == np.dtype(dtype) and result.dtype.isnative
    assert result.shape == array.shape
    np.testing.assert_array_equal(result, array)
    result[0, 0, 0] = 0  # writable, not a view of immutable bytes


@pytest.mark.parametrize("code, dtype, big_endian_type", IDX_CASES)
@pytest.mark.parametrize("name", ["roundtrip.idx", "roundtrip.idx.gz"])
def test_write_idx_then_read_idx_roundtrips(tmp_path, code, dtype, big_endian_type, name):
    array = _sample_array(dtype, shape=(7, 2))
    path = tmp_path / name
    write_idx(path, array)
    raw = path.read_bytes()
    if name.endswith(".gz"):
        assert raw[:2] == b"\x1f\x8b"
        raw = gzip.decompress(raw)
    assert raw == _hand_written_idx(code, big_endian_type, array)
    np.testing.assert_array_equal(read_idx(path), array)


@pytest.mark.parametrize("shape", [(), (0,), (5,), (0, 28, 28), (2, 1, 1, 1, 3)])
def test_idx_roundtrips_unusual_shapes(tmp_path, shape):
    array = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    write_idx(tmp_path / "a.idx", array)
    result = read_idx(tmp_path / "a.idx")
    assert result.shape == shape
    np.testing.assert_array_equal(result, array)


def test_gzip_is_recognised_by_content_not_name(tmp_path):
    array = np.arange(10, dtype=np.uint8)
    write_idx(tmp_path / "no-extension", array, compress=True)
    np.testing.assert_array_equal(read_idx(tmp_path / "no-extension"), array)


def test_write_idx_refuses_types_idx_cannot_hold(tmp_path):
    with pytest.raises(TypeError, match="int64"):
        write_idx(tmp_path / "x.idx", np.arange(3, dtype=np.int64))


def _valid_idx_bytes():
    return _hand_written_idx(0x08, ">u1", np.arange(24, dtype=np.uint8).reshape(2, 3, 4))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda raw: raw[:-5], "truncated"),
        (lambda raw: raw + b"\x00\x01", "extra bytes"),
        (lambda raw: raw[:2], "too short"),
        (lambda raw: raw[:9], "before their sizes"),
        (lambda raw: b"\x01\x02" + raw[2:], "magic"),
        (lambda raw: raw[:2] + b"\x0a" + raw[3:], "type code 0x0A"),
        (lambda raw: b"", "empty or truncated"),
    ],
)
def test_damaged_idx_files_give_clear_errors(tmp_path, damage, message):
    path = tmp_path / "damaged-idx3-ubyte"
    path.write_bytes(damage(_valid_idx_bytes()))
    with pytest.raises(IDXFormatError, match=message) as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_truncated_gzip_gives_a_clear_error(tmp_path):
    path = tmp_path / "cut.idx.gz"
    path.write_bytes(gzip.compress(_valid_idx_bytes())[:-10])
    with pytest.raises(IDXFormatError, match="truncated or corrupt"):
        read_idx(path)


def test_truncated_data_inside_gzip_gives_a_clear_error(tmp_path):
    path = tmp_path / "short.idx.gz"
    path.write_bytes(gzip.compress(_valid_idx_bytes()[:-1]))
    with pytest.raises(IDXFormatError, match="truncated"):
        read_idx(path)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "nothing-here")


# ---------------------------------------------------------------------------
# MNIST from a directory of IDX files
# ---------------------------------------------------------------------------


def _fake_mnist(directory, n_train=6, n_test=4, gzip_train=True):
    rng = np.random.default_rng(0)
    images = {
        "train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "t10k": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
    }
    images["train"][0, 0, 0], images["train"][0, 0, 1] = 0, 255
    labels = {
        "train": np.arange(n_train, dtype=np.uint8) % 10,
        "t10k": np.arange(n_test, dtype=np.uint8),
    }
    for split in ("train", "t10k"):
        suffix = ".gz" if split == "train" and gzip_train else ""
        write_idx(directory / f"{split}-images-idx3-ubyte{suffix}", images[split])
        write_idx(directory / f"{split}-labels-idx1-ubyte{suffix}", labels[split])
    return images, labels


def test_load_mnist_reads_plain_and_gzip_files(tmp_path):
    images, labels = _fake_mnist(tmp_path)
    x_train, y_train, x_test, y_test = load_mnist(tmp_path)
    assert x_train.shape == (6, 784) and x_test.shape == (4, 784)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert x_train.min() == 0.0 and x_train.max() == 1.0
    np.testing.assert_allclose(x_test.reshape(4, 28, 28) * 255, images["t10k"], atol=1e-4)
    np.testing.assert_array_equal(y_train, labels["train"])
    np.testing.assert_array_equal(y_test, labels["t10k"])
    cnn = load_mnist(tmp_path, flatten=False, dtype=np.float64)
    assert cnn[0].shape == (6, 1, 28, 28) and cnn[0].dtype == np.float64


def test_load_mnist_names_the_missing_file_and_where_to_get_it(tmp_path):
    _fake_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte") as error:
        load_mnist(tmp_path)
    assert str(tmp_path) in str(error.value) and "https://" in str(error.value)


def test_load_mnist_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mnist(tmp_path / "mnist")


def test_load_mnist_detects_mismatched_files(tmp_path):
    _fake_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(3, np.uint8))
    with pytest.raises(IDXFormatError, match="4 images but .* 3 labels"):
        load_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros((4, 28, 28), np.uint8))
    with pytest.raises(IDXFormatError, match="labels must be"):
        load_mnist(tmp_path)


# ---------------------------------------------------------------------------
# Synthetic data
# ---------------------------------------------------------------------------


def test_linear_regression_least_squares_recovers_true_weights():
    x, y, true_weights, true_bias = make_linear_regression(
        2000, 5, noise=0.01, seed=3, dtype=np.float64
    )
    assert x.shape == (2000, 5) and y.shape == (2000,) and true_weights.shape == (5,)
    assert isinstance(true_bias, float)
    design = np.hstack([x, np.ones((len(x), 1))])
    solution = np.linalg.lstsq(design, y, rcond=None)[0]
    np.testing.assert_allclose(solution[:5], true_weights, atol=2e-3)
    assert abs(solution[5] - true_bias) < 2e-3


def test_linear_regression_without_noise_is_exact():
    x, y, true_weights, true_bias = make_linear_regression(
        50, 3, noise=0.0, seed=1, dtype=np.float64
    )
    np.testing.assert_allclose(x @ true_weights + true_bias, y, rtol=0, atol=1e-12)


def test_synthetic_sets_are_deterministic_per_seed():
    for make in (make_linear_regression, make_spirals, make_blobs, make_sparse_logistic):
        first, again, other = make(seed=5), make(seed=5), make(seed=6)
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)
        assert not np.array_equal(first[0], other[0])


def test_spirals_shape_balance_and_nonlinearity():
    x, y = make_spirals(301, 3, noise=0.2, seed=0)
    assert x.shape == (301, 2) and x.dtype == np.float32 and y.dtype == np.int64
    assert np.bincount(y).tolist() == [101, 100, 100]
    assert np.abs(x).max() <= 1.0
    # The point of spirals: a linear least-squares classifier does poorly.
    design = np.hstack([x, np.ones((len(x), 1))])
    weights = np.linalg.lstsq(design, np.eye(3)[y], rcond=None)[0]
    assert ((design @ weights).argmax(axis=1) == y).mean() < 0.7


def test_blobs_are_separated_by_nearest_centre():
    x, y = make_blobs(600, 4, noise=1.0, seed=2, n_features=3)
    assert x.shape == (600, 3) and np.bincount(y).tolist() == [150] * 4
    centres = np.stack([x[y == k].mean(axis=0) for k in range(4)])
    nearest = np.argmin(((x[:, None, :] - centres[None]) ** 2).sum(axis=-1), axis=1)
    assert (nearest == y).mean() > 0.95


def test_sparse_logistic_has_fixed_sparsity_and_known_model():
    x, y, true_weights = make_sparse_logistic(2000, 200, nonzeros_per_sample=4, seed=0)
    assert x.shape == (2000, 200) and true_weights.shape == (200,)
    assert ((x != 0).sum(axis=1) == 4).all()
    assert set(np.unique(y).tolist()) == {0, 1} and 0.3 < y.mean() < 0.7
    assert ((x @ true_weights > 0) == y).mean() > 0.8


@pytest.mark.parametrize(
    "call",
    [
        lambda: make_linear_regression(n_samples=0),
        lambda: make_linear_regression(noise=-1.0),
        lambda: make_spirals(n_classes=0),
        lambda: make_blobs(n_features=1),
        lambda: make_sparse_logistic(n_features=3, nonzeros_per_sample=4),
    ],
)
def test_synthetic_arguments_are_checked(call):
    with pytest.raises(ValueError):
        call()


# ---------------------------------------------------------------------------
# DataLoader
# ---------------------------------------------------------------------------


def _xy(n=10):
    return np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n, dtype=np.int64)


def test_loader_batches_in_order_with_a_short_last_batch():
    x, y = _xy(10)
    loader = DataLoader((x, y), batch_size=4)
    batches = list(loader)
    assert len(loader) == 3 == len(batches)
    assert [len(b[1]) for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y)


def test_loader_drop_last():
    loader = DataLoader(_xy(10), batch_size=4, drop_last=True)
    assert len(loader) == 2
    assert [len(yb) for _, yb in loader] == [4, 4]
    assert len(DataLoader(_xy(8), batch_size=4, drop_last=True)) == 2
    assert len(DataLoader(_xy(3), batch_size=4, drop_last=True)) == 0
    assert list(DataLoader(_xy(3), batch_size=4, drop_last=True)) == []


def test_loader_shuffles_a_new_permutation_each_epoch_deterministically():
    x, y = _xy(50)
    loader = DataLoader((x, y), batch_size=7, shuffle=True, seed=11)
    epochs = [np.concatenate([yb for _, yb in loader]) for _ in range(3)]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(50))
    assert not np.array_equal(epochs[0], epochs[1])
    assert not np.array_equal(epochs[1], epochs[2])
    # Pairs stay pairs under shuffling.
    for xb, yb in DataLoader((x, y), batch_size=7, shuffle=True, seed=11):
        np.testing.assert_array_equal(xb[:, 0], 2 * yb)
    # Another loader with the same seed gives the same sequence of epochs...
    again = DataLoader((x, y), batch_size=7, shuffle=True, seed=11)
    for order in epochs:
        np.testing.assert_array_equal(np.concatenate([yb for _, yb in again]), order)
    # ...and set_epoch replays any one of them.
    again.set_epoch(1)
    np.testing.assert_array_equal(np.concatenate([yb for _, yb in again]), epochs[1])
    other = DataLoader((x, y), batch_size=7, shuffle=True, seed=12)
    assert not np.array_equal(np.concatenate([yb for _, yb in other]), epochs[0])


def test_loader_without_seed_records_the_one_it_drew():
    loader = DataLoader(_xy(20), batch_size=20, shuffle=True)
    first = next(iter(loader))[1]
    replay = DataLoader(_xy(20), batch_size=20, shuffle=True, seed=loader.seed)
    np.testing.assert_array_equal(next(iter(replay))[1], first)


def test_loader_accepts_single_arrays_datasets_and_more_arrays():
    x, y = _xy(5)
    assert [b.shape for b in DataLoader(x, batch_size=2)] == [(2, 2), (2, 2), (1, 2)]
    batches = list(DataLoader(ArrayDataset(x, y, y * 10), batch_size=5))
    assert len(batches) == 1 and len(batches[0]) == 3
    np.testing.assert_array_equal(batches[0][2], y * 10)
    assert list(DataLoader((x[:0], y[:0]), batch_size=2)) == []


def test_loader_batches_are_copies():
    x, y = _xy(6)
    for xb, _ in DataLoader((x, y), batch_size=3):
        xb[:] = -1
    assert x.min() == 0


def test_loader_with_a_plain_sampler():
    x, y = _xy(6)
    loader = DataLoader((x, y), batch_size=2, sampler=[5, 0, 3])
    assert len(loader) == 2
    assert [yb.tolist() for _, yb in loader] == [[5, 0], [3]]


def test_loader_and_dataset_errors():
    x, y = _xy(4)
    with pytest.raises(ValueError, match="different numbers of samples"):
        DataLoader((x, y[:3]), batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader((x, y), batch_size=0)
    with pytest.raises(TypeError, match="batch_size"):
        DataLoader((x, y), batch_size=2.0)
    with pytest.raises(ValueError, match="sampler"):
        DataLoader((x, y), batch_size=2, shuffle=True, sampler=DistributedSampler(4, 2, 0))
    with pytest.raises(TypeError, match="tuple of arrays"):
        DataLoader(42, batch_size=2)


# ---------------------------------------------------------------------------
# DistributedSampler
# ---------------------------------------------------------------------------


def _shares(n, replicas, epoch=0, **options):
    samplers = [DistributedSampler(n, replicas, rank, **options) for rank in range(replicas)]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    return [sampler.indices() for sampler in samplers], samplers


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 120),
    replicas=st.integers(1, 9),
    shuffle=st.booleans(),
    mode=st.sampled_from(["pad", "drop_last", "uneven"]),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
)
def test_sampler_shares_properties(n, replicas, shuffle, mode, seed, epoch):
    options = dict(shuffle=shuffle, seed=seed, drop_last=mode == "drop_last", pad=mode != "uneven")
    shares, samplers = _shares(n, replicas, epoch, **options)
    lengths = [len(share) for share in shares]
    assert lengths == [len(sampler) for sampler in samplers]
    assert lengths == [len(list(sampler)) for sampler in samplers]
    everything = np.concatenate(shares)
    assert everything.dtype == np.int64
    assert ((0 <= everything) & (everything < max(n, 1))).all()
    if mode == "pad":
        expected = -(-n // replicas)
        assert lengths == [expected] * replicas
        assert set(everything.tolist()) == set(range(n))  # every sample read
    elif mode == "drop_last":
        assert lengths == [n // replicas] * replicas
        assert len(set(everything.tolist())) == len(everything)  # disjoint
    else:
        assert sorted(everything.tolist()) == list(range(n))  # an exact partition
        assert max(lengths, default=0) - min(lengths, default=0) <= 1
        assert lengths == sorted(lengths, reverse=True)  # the first ranks get the extra


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 100), replicas=st.integers(1, 8), seed=st.integers(0, 1000))
def test_sampler_ranks_agree_on_one_order(n, replicas, seed):
    shares, _ = _shares(n, replicas, epoch=3, seed=seed, pad=False)
    # Interleave the shares back: it is the single permutation all ranks computed.
    order = np.empty(n, dtype=np.int64)
    for rank, share in enumerate(shares):
        order[rank::replicas] = share
    np.testing.assert_array_equal(order, np.random.default_rng(seed + 3).permutation(n))


def test_sampler_without_shuffle_is_strided():
    shares, _ = _shares(10, 3, shuffle=False)
    assert [s.tolist() for s in shares] == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    shares, _ = _shares(10, 3, shuffle=False, drop_last=True)
    assert [s.tolist() for s in shares] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    shares, _ = _shares(10, 3, shuffle=False, pad=False)
    assert [s.tolist() for s in shares] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_sampler_pads_even_when_there_are_fewer_samples_than_ranks():
    shares, _ = _shares(2, 5, shuffle=False)
    assert [s.tolist() for s in shares] == [[0], [1], [0], [1], [0]]
    shares, _ = _shares(0, 3)
    assert [len(s) for s in shares] == [0, 0, 0]


def test_sampler_epochs_reshuffle_and_repeat():
    sampler = DistributedSampler(100, 4, 1, seed=7)
    epoch0 = sampler.indices()
    np.testing.assert_array_equal(sampler.indices(), epoch0)  # no set_epoch, same order
    sampler.set_epoch(1)
    epoch1 = sampler.indices()
    assert not np.array_equal(epoch0, epoch1)
    sampler.set_epoch(0)
    np.testing.assert_array_equal(sampler.indices(), epoch0)
    assert not np.array_equal(DistributedSampler(100, 4, 1, seed=8).indices(), epoch0)


def test_uneven_shards_weighted_by_size_equal_the_full_batch():
    x, _, _, _ = make_linear_regression(103, 4, seed=0, dtype=np.float64)
    shares, _ = _shares(len(x), 4, pad=False)
    weighted = sum(len(share) / len(x) * x[share].mean(axis=0) for share in shares)
    np.testing.assert_allclose(weighted, x.mean(axis=0), rtol=1e-12)


def test_loader_with_distributed_sampler_covers_the_data_across_ranks():
    x, y = _xy(23)
    seen = []
    for rank in range(3):
        sampler = DistributedSampler(ArrayDataset(x, y), num_replicas=3, rank=rank, seed=1)
        loader = DataLoader((x, y), batch_size=4, sampler=sampler)
        assert len(loader) == 2  # ceil(23 / 3) = 8 samples, 2 batches
        loader.set_epoch(2)
        assert sampler.epoch == 2
        for xb, yb in loader:
            np.testing.assert_array_equal(xb[:, 0], 2 * yb)
            seen.extend(yb.tolist())
    assert len(seen) == 24 and set(seen) == set(range(23))


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ((10, 4, 4), ValueError, "rank 4 is out of range .* 0..3"),
        ((10, 4, -1), ValueError, "out of range"),
        ((10, 0, 0), ValueError, "num_replicas must be >= 1"),
        ((10, 2.0, 0), TypeError, "num_replicas"),
        ((10, 2, "0"), TypeError, "rank"),
        ((-1, 2, 0), ValueError, "size must be >= 0"),
        ((object(), 2, 0), TypeError, "len"),
    ],
)
def test_sampler_errors(arguments, error, message):
    with pytest.raises(error, match=message):
        DistributedSampler(*arguments)


def test_sampler_set_epoch_rejects_negative():
    with pytest.raises(ValueError, match="epoch"):
        DistributedSampler(10, 2, 0).set_epoch(-1)


def test_sampler_without_replicas_outside_a_run_says_what_to_pass(monkeypatch):
    """torch reads num_replicas and rank from the default process group; with
    none initialized it refuses, and so does minidist, saying what to pass."""
    from minidist.runtime import membership

    monkeypatch.setattr(membership, "_place", None)   # outside any run
    with pytest.raises(RuntimeError, match="Default process group has not been initialized") \
            as caught:
        DistributedSampler(10)
    assert "pass num_replicas= and rank=" in str(caught.value)
    with pytest.raises(RuntimeError, match="not been initialized"):
        DistributedSampler(10, num_replicas=2)   # rank still missing


def test_sampler_of_an_x_y_tuple_counts_samples_not_arrays():
    """DistributedSampler((x, y)) takes the DataLoader's form of a data set:
    len((x, y)) is 2, and a sampler that read it would train on two samples."""
    x, y = np.zeros((10, 3)), np.arange(10)
    sampler = DistributedSampler((x, y), num_replicas=2, rank=1, shuffle=False)
    assert len(sampler) == 5 and list(sampler) == [1, 3, 5, 7, 9]
    with pytest.raises(ValueError, match="different lengths"):
        DistributedSampler((x, y[:9]), num_replicas=2, rank=0)
