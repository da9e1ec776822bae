"""Lesson 21's prose chose its words from its numbers: each verdict agrees
with the values it was chosen from, and the numbers it cites are the
formulas' (a tensor of N bytes on n ranks: (n-1)/n N gathered, 2(n-1)/n N
all-reduced, (n-1)/n^2 N swapped by the all_to_all); and of the second half: the
layouts of Megatron's MLP, FSDP1's and FSDP2's ledgers and bytes, the checkpoint's
reads, and the norms of sharded gradients."""


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

    # Section 6: Megatron's MLP as placements, then torch's styles and the split layers.
    assert text(glued, "h_layout") == "(S(1))"                 # x @ W1 is Shard(1)
    assert text(glued, "gelu_layout") == "(S(1))"              # GELU keeps it
    assert text(glued, "y_layout") == "(P(sum))"               # S(1) x S(0) -> Partial
    assert text(glued, "z_layout") == "(R)"
    assert value(glued, "quiet_until_reduce") is True
    assert text(glued, "quiet_text") == "no collective ran in the three ops"
    assert text(glued, "reduce_calls") == "all_reduce"         # the one message
    assert value(glued, "placed_error") < 1e-12
    assert value(glued, "hidden_piece") * 4 == value(glued, "d_hidden")   # "each rank 4 of 16"
    assert text(glued, "fc1_layout") == "(S(0))"               # ColwiseParallel: torch's Shard(0)
    assert text(glued, "fc2_layout") == "(S(1))"               # RowwiseParallel: Shard(1)
    assert value(glued, "same_messages") is True
    assert text(glued, "messages_text").startswith("the same collectives")
    assert text(glued, "forward_calls") == "all_reduce"        # "one all_reduce" forward (g)
    assert text(glued, "backward_calls") == "all_reduce"       # and one backward (f)
    assert value(glued, "worst_output") < 1e-12 and value(glued, "worst_grad") < 1e-12
    assert value(glued, "three_agree") is True

    # Section 7: FSDP2 against FSDP1 (the MLP of 100 float64 parameters on 4 ranks).
    model = value(glued, "model_bytes")
    assert model == 100 * 8
    fsdp1 = [int(v) for v in text(glued, "fsdp1_per_rank").split(", ")]
    fsdp2 = [int(v) for v in text(glued, "fsdp2_per_rank").split(", ")]
    assert value(glued, "fsdp1_equal_slices") is True and len(set(fsdp1)) == 1   # "equal slices"
    assert sum(fsdp1) == value(glued, "fsdp1_sum") == model + 8 * value(glued, "fsdp1_padding")
    assert value(glued, "fsdp1_padding_bytes") == 8 * value(glued, "fsdp1_padding")
    assert value(glued, "fsdp1_pads_exactly") is True
    assert sum(fsdp2) == value(glued, "fsdp2_sum") == model         # "the model exactly"
    assert value(glued, "fsdp2_sums_to_model") is True
    assert value(glued, "fsdp2_last_least") is True and fsdp2[-1] == min(fsdp2) == 6 * 8
    assert value(glued, "fsdp2_padding") > value(glued, "fsdp1_padding")
    assert value(glued, "grads_equal_params") is True and value(glued, "moments_twice") is True
    assert value(glued, "fsdp_equal") is True and value(glued, "fsdp_weight_error") < 1e-12
    assert value(glued, "fsdp2_gathers") == value(glued, "fsdp1_gathers") == 6   # 2 per unit
    assert value(glued, "fsdp2_reduces") == value(glued, "fsdp1_reduces") == 3   # 1 per unit
    assert value(glued, "prefetched") == 2                  # the second and the third unit
    assert value(glued, "fsdp_bytes_formula") is True
    assert text(glued, "fsdp_formula_text") == "the formula's to the byte"
    assert value(glued, "fsdp1_step_bytes") == 3 * 3 * value(glued, "fsdp1_piece") * 8
    assert value(glued, "fsdp2_step_bytes") == 3 * 3 * value(glued, "fsdp2_piece") * 8
    assert value(glued, "fsdp1_piece") * 4 == model // 8 + value(glued, "fsdp1_padding")
    assert value(glued, "fsdp1_all_reduces") == 1 and value(glued, "fsdp2_all_reduces") == 0
    assert value(glued, "fsdp1_count_bytes") > 0

    # Section 8: the checkpoint saved on dp2 x tp2, loaded into tp4 and dp4.
    assert value(glued, "bit_for_bit") is True
    assert text(glued, "bits_text").startswith("every parameter's local piece")
    assert value(glued, "saved_bytes") == value(glued, "whole_model_bytes")   # each box once
    assert value(glued, "dp4_quarter") is True                 # "a quarter of each tensor's rows"
    assert text(glued, "drawn_saved_layout") == "(S(1))"       # its columns cut on tp
    assert value(glued, "drawn_chunks_each") is True
    assert text(glued, "drawn_chunks_text").startswith("2 chunks")
    assert text(glued, "drawn_rank1").startswith("rank 1 read 2 of 2 chunks")

    # Section 9: clip_grad_norm_ on local shards, wrong on every rank; the global one right.
    true_norm = float(text(glued, "true_norm"))
    for name in ("fsdp1_local_norms", "fsdp2_local_norms"):
        local = [float(v) for v in text(glued, name).split(", ")]
        assert all(v < true_norm for v in local)               # "each below the true one"
        assert len(set(local)) == 4                            # "another on every rank"
        assert abs(sum(v * v for v in local) - true_norm ** 2) < 1e-3   # 4-digit texts
    assert value(glued, "all_below") is True and value(glued, "squares_sum") is True
    assert value(glued, "distinct_norms") is True
    assert value(glued, "global_right") is True
    assert text(glued, "global_text").startswith("equals one process's")
    assert value(glued, "clip_error") < 1e-12
    fsdp2_local = [float(v) for v in text(glued, "fsdp2_local_norms").split(", ")]
    assert value(glued, "fsdp2_smallest_rank") == fsdp2_local.index(min(fsdp2_local)) == 3
    assert value(glued, "report_is_picture") is True
    assert text(glued, "report_text") == "are the table's"
    assert value(glued, "gathered_first") is True and value(glued, "reduces_after") is True
    assert text(glued, "order_text").startswith("each unit's forward began after")
