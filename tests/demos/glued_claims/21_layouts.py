"""Lesson 21's prose chose its words from its numbers: each verdict agrees
with the values it was chosen from, and the numbers it cites are the
formulas' (a tensor of N bytes on n ranks: (n-1)/n N gathered, 2(n-1)/n N
all-reduced, (n-1)/n^2 N swapped by the all_to_all)."""


def value(glued, name):
    return glued[name]["value"]


def text(glued, name):
    return glued[name]["text"]


def check(glued):
    # Section 1: what every rank held on the real processes.
    assert value(glued, "agree_1d") is True
    assert text(glued, "agree_1d_text").startswith("every rank's piece")
    assert value(glued, "partial_whole") is True
    assert text(glued, "partial_text") == "add up to the tensor"
    assert value(glued, "s0_rows_per_rank") == 1            # "each rank holds 1 row of the 4"
    assert text(glued, "s1_columns") == "2, 2, 2, 2"

    # Section 2: the 2 x 2 mesh.
    assert value(glued, "agree_2d") is True
    assert text(glued, "agree_2d_text").startswith("every rank holds the box")
    assert text(glued, "band_rank1") == "A[2:4, 0:4]"       # "the second band"

    # Section 3: every change, trace = plan = formula.
    assert value(glued, "all_right") is True
    assert text(glued, "right_text").startswith("every rank ended")
    assert value(glued, "all_exact") is True
    assert text(glued, "exact_text").startswith("the bytes every rank sent")
    n, whole = value(glued, "first_n"), value(glued, "whole_bytes")
    assert value(glued, "gather_bytes") == (n - 1) * whole // n
    assert value(glued, "reduce_bytes") == 2 * value(glued, "gather_bytes")   # "twice that"
    assert value(glued, "swap_bytes") * n == value(glued, "gather_bytes")    # "n times less"
    assert value(glued, "ring_one_peer") is True and text(glued, "ring_peers") == "1"
    assert text(glued, "a2a_peers") == ", ".join(str(r) for r in range(1, n))   # each other rank
    assert value(glued, "square_exact") is True
    assert text(glued, "square_text").startswith("two all_gathers")
    step1, step2 = value(glued, "step1_bytes"), value(glued, "step2_bytes")
    assert step2 == 2 * step1 and step1 == 8 * 12 * 8 // 4   # its quarter sent once, then a half
    assert value(glued, "square_total") == step1 + step2

    # Section 4: uneven chunks.
    assert text(glued, "torch_sizes") == "2, 2, 1, 0"
    assert text(glued, "numpy_sizes") == "2, 1, 1, 1"
    assert value(glued, "held_is_torch") is True
    assert text(glued, "held_text") == "the same as torch.chunk's"
    assert value(glued, "padding_exact") is True
    assert value(glued, "padded_bytes") == 3 * 4 * 2 * 4 * 8 // 4
    assert value(glued, "uneven_planned") == value(glued, "padded_bytes")
    assert value(glued, "unpadded_bytes") == 3 * 5 * 4 * 8 / 4
    assert abs(value(glued, "padding_share") - 8 / 5) < 1e-12

    # Section 5: the backward is the opposite change.
    assert value(glued, "backward_right") is True
    assert text(glued, "backward_right_text").startswith("every leaf got")
    assert value(glued, "backward_exact") is True
    assert text(glued, "backward_exact_text").startswith("the collective the trace shows")
    assert value(glued, "gather_back_bytes") == value(glued, "gather_bytes")
