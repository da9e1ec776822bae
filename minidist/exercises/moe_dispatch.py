"""Exercise: the dispatch and combine of expert parallelism (lesson 19).

A mixture-of-experts layer (:class:`~minidist.models.moe.MoE`) sends each
token to k of its E experts. Under expert parallelism
(:mod:`minidist.parallel.expert.dispatch`) rank j of n holds the experts
j E/n .. (j+1) E/n - 1, and every rank routes its own tokens; the rows of
its kept choices must travel to the ranks of their experts and their
outputs come back:

1. split sizes: the rows for each rank (the kept choices whose expert it holds);
2. counts first: an all_to_all of the E per-expert counts, so that every
   rank knows how many rows each source sends to each of its experts;
3. the tokens: an ``all_to_all_single`` of the rows, grouped by
   destination, with uneven split sizes;
4. this rank's experts on what arrived (source by source, expert by expert
   within a source);
5. the combine: the outputs back by the transposed all_to_all (split sizes
   swapped), each into the place of the choice it came from.

The student writes ``moe_dispatch(x, choices, kept, n_expert, experts)``,
steps 1 to 5; the router, the capacity, the experts and the gating around
it are the layer's own (:class:`~.dispatch_layer.StudentDispatch`). Checked
on real processes (2 and 4 ranks, float64:
:func:`~.process_check.check_beside_reference`; top-1 and top-2 routing,
capacity tight enough that choices are dropped) against the one-process MoE
on each rank's tokens (:func:`~.dispatch_layer.one_process`): what each
rank's experts were given (which rows, through which expert), what the
student returns (every kept choice's expert output, zeros for a dropped
one) and the layer's output. The outputs only: the function works on arrays, so no
gradient flows through it (the backward is the same two all_to_alls
transposed, :func:`~minidist.parallel.expert.dispatch.all_to_all_rows`).
A wrong split size, rows in routing order, a missing combine, split sizes
not swapped in the combine are each told as such; the student's all_to_all
is replayed beside the reference's.
"""

from __future__ import annotations

import re

import numpy as np

import minidist.distributed as dist
from minidist.exercises.dispatch_layer import StudentDispatch, one_process, whose_row
from minidist.exercises.exercise import Exercise, Failure
from minidist.exercises.process_check import (
    check_beside_reference,
    replay_of_calls,
    same,
    traced_calls,
)
from minidist.models.gpt import GPTConfig
from minidist.models.moe import MoE
from minidist.tensor import Tensor

#: E experts of width C, N tokens per rank; (top_k, capacity_factor) per case
EXPERTS, WIDTH, TOKENS = 8, 8, 12
CASES = ((1, 1.0), (2, 1.0))
SEED = 19
#: what a check that passes has held
PASSED = (f", {EXPERTS} experts, top-1 and top-2 with dropped choices: every rank's experts got "
          "exactly their tokens' rows",
          "every kept choice got its expert's output back (zeros for the dropped), and every "
          "rank's layer output equals the one-process MoE's")


def moe_dispatch(x, choices, kept, n_expert, experts):
    """The reference. Cost per rank: an all_to_all of E counts, then the
    kept rows to their experts' ranks and their outputs back, (D + R) C
    values each way (D rows sent to other ranks, R received from them)."""
    n = dist.get_world_size()
    local = n_expert // n    # rank j holds experts j local .. (j + 1) local - 1
    token, which = np.nonzero(kept)                 # the kept choices, in routing order
    expert = choices[token, which]
    order = np.argsort(expert, kind="stable")       # grouped by expert, so by destination rank
    counts = np.bincount(expert, minlength=n_expert).astype(np.int64)
    arriving = np.empty_like(counts)
    dist.all_to_all_single(arriving, counts)        # E / n counts to each rank
    per_source = arriving.reshape(n, local)         # rows from source i for each of my experts
    sent, received = counts.reshape(n, local).sum(axis=1), per_source.sum(axis=1)
    rows = np.empty((int(received.sum()), x.shape[1]), dtype=x.dtype)
    dist.all_to_all_single(rows, np.ascontiguousarray(x[token[order]]),
                           output_split_sizes=received.tolist(), input_split_sizes=sent.tolist())
    # Arrived: source by source, within a source expert by expert.
    local_expert = np.repeat(np.tile(np.arange(local), n), per_source.reshape(-1))
    outputs = experts(rows, local_expert)
    back = np.empty((order.size, x.shape[1]), dtype=x.dtype)
    dist.all_to_all_single(back, outputs, output_split_sizes=sent.tolist(),
                           input_split_sizes=received.tolist())
    out = np.zeros(choices.shape + (x.shape[1],), dtype=x.dtype)
    out[token[order], which[order]] = back          # undo the grouping
    return out


# --------------------------------------------------------------------------- the cases


def _problem(case: int, rank: int):
    """The whole MoE of case ``case`` (the same on every rank) and rank ``rank``'s tokens."""
    top_k, factor = CASES[case]
    config = GPTConfig(vocab_size=1, block_size=TOKENS, n_layer=1, n_head=1, n_embd=WIDTH)
    generator = np.random.default_rng(SEED + case)
    moe = MoE(config, EXPERTS, top_k, factor, rng=generator, dtype=np.float64)
    moe.router.weight.data[...] = generator.standard_normal(moe.router.weight.data.shape)
    tokens = np.random.default_rng([SEED, case, rank]).standard_normal((TOKENS, WIDTH))
    return moe, tokens


def _run(solution, case):
    """This rank's (layer output, what the solution returned, what its experts were given)."""
    moe, tokens = _problem(case, dist.get_rank())
    layer = StudentDispatch(moe, solution)
    y = layer(Tensor(tokens))
    return np.array(y.data), layer.answer, layer.arrivals


# --------------------------------------------------------------------------- the check


def check(function, **options):
    return check_beside_reference("moe_dispatch", _run, function, moe_dispatch, "moe_dispatch",
                                  _judge, PASSED, cases=len(CASES), explain=_explain)


def _judge(n, case, results, events):
    """The first thing wrong, and the replay of the student's all_to_all it
    points at (call 1: the rows, 2: the rows back) beside the reference's."""
    failure, call = _compare(n, case, results)
    if failure is None or call is None:
        return None if failure is None else (failure, None)
    mine, theirs = (traced_calls(events, run, f"case {case}") for run in ("yours", "reference"))
    if call >= min(len(mine), len(theirs)):
        return failure, None
    what = ("the dispatch (the rows to their experts' ranks)" if call == 1
            else "the combine (the outputs back)")
    return failure, replay_of_calls(n, events, mine[call], theirs[call], 1,
                                    f"your all_to_all {call + 1}, {what}: {failure.kind}")


_SPLITS = re.compile(r"(input|output)_split_sizes=\[([\d, ]*)\] sum to (\d+) rows, but dim 0 "
                     r"has (\d+)")


def _explain(failure: Failure) -> Failure:
    """A raise inside the student's all_to_all, told with what to do."""
    text = failure.message
    if failure.kind != "raised" or "split_sizes" not in text:
        return failure
    found = _SPLITS.search(text)
    if "in the combine" in text:
        return Failure("combine sizes", (
            "the combine's split sizes are wrong: it sends back what arrived here, so its "
            "input_split_sizes are the rows that came from each rank (the dispatch's "
            "output_split_sizes) and its output_split_sizes the rows this rank sent to each "
            "(the dispatch's input_split_sizes): the dispatch's two lists, swapped. " + text),
            rank=failure.rank)
    if found and found.group(1) == "input":
        return Failure("split sizes", (
            f"your split sizes {found.group(1)}_split_sizes=[{found.group(2)}] sum to "
            f"{found.group(3)} rows, but you send {found.group(4)}: input_split_sizes[j] "
            "is the rows for rank j, the kept choices whose expert rank j holds (expert // "
            "(E / n)); a dropped choice is not sent and not counted. " + text),
            rank=failure.rank)
    return Failure("split sizes", (
        "the split sizes do not fit the rows: input_split_sizes[j] is the rows sent to rank "
        "j, output_split_sizes[i] the rows rank i sends here (from the counts' all_to_all), "
        "each summing to its array's rows. " + text), rank=failure.rank)


def _sorted_rows(rows):
    return rows[np.lexsort(rows.T[::-1])] if len(rows) else rows


def _compare(n, case, results):
    """The first thing wrong, stage by stage; (Failure, the student's call to replay)."""
    top_k, factor = CASES[case]
    # per rank: (tokens, routing, the layer's output, each choice's expert output)
    wanted = [(tokens, *one_process(moe, tokens))
              for moe, tokens in (_problem(case, rank) for rank in range(n))]
    local = EXPERTS // n
    what = f"on {n} ranks (top-{top_k}, capacity factor {factor})"
    for rank, (_, _, arrivals) in enumerate(results):
        if len(arrivals) != 1:
            return Failure("wrong result", (
                f"{what}: rank {rank} called experts(rows, local_expert) {len(arrivals)} times: "
                "call it once, on every row that arrived"), rank=rank), None
        rows, local_expert, _ = arrivals[0]
        expected = [np.array([tokens[t] for tokens, routing, _, _ in wanted
                              for t, w in zip(*np.nonzero(routing.kept))
                              if routing.choices[t, w] == rank * local + e]).reshape(-1, WIDTH)
                    for e in range(local)]
        every = np.concatenate(expected)
        if rows.shape[0] != every.shape[0]:
            return Failure("wrong rows", (
                f"{what}: rank {rank}'s experts were given {rows.shape[0]} rows, but "
                f"{every.shape[0]} kept choices name its experts "
                f"{rank * local}..{rank * local + local - 1}"), rank=rank), 1
        for e, want in enumerate(expected):
            mine, expert = rows[local_expert == e], rank * local + e
            if mine.shape == want.shape and np.array_equal(_sorted_rows(mine), _sorted_rows(want)):
                continue
            stray = next((row for row in mine if not any(np.array_equal(row, w) for w in want)),
                         None)
            if stray is None:
                return Failure("wrong rows", (
                    f"{what}: rank {rank} ran {len(mine)} rows through expert {expert}, but "
                    f"{len(want)} kept choices name it"), rank=rank), 1
            told = _told_whose(stray, wanted)
            if np.array_equal(_sorted_rows(rows), _sorted_rows(every)):
                return Failure("wrong expert", (
                    f"{what}: rank {rank} received the right rows but ran some through the wrong "
                    f"expert: of the rows it ran through expert {expert}, {told}. The rows "
                    "arrive source by source, and within a source expert by expert (as each "
                    "source sorted them): local_expert follows the counts' all_to_all, "
                    "source by source"), rank=rank), 1
            return Failure("routing order", (
                f"{what}: rank {rank} received expert {expert}'s tokens from the wrong rows: "
                f"{told}. all_to_all_single sends the first input_split_sizes[0] rows to rank "
                "0, the next input_split_sizes[1] to rank 1, and so on: group the rows by "
                "destination (sort the kept choices by expert, stably) before sending, not in "
                "routing order"), rank=rank), 1
    for rank, result in enumerate(results):
        failure, call = _check_answer(what, rank, result, wanted)
        if failure is not None:
            return failure, call
    return None, None


def _told_whose(row, wanted) -> str:
    owner = whose_row(row, [tokens for tokens, *_ in wanted])
    if owner is None:
        return "one of them is no token's row at all"
    source, token = owner
    routing = wanted[source][1]
    kept = [int(c) for c, k in zip(routing.choices[token], routing.kept[token]) if k]
    return (f"one of them is token {token} of rank {source}, which rank {source} "
            f"routed to expert{'s' if len(kept) != 1 else ''} "
            f"{', '.join(map(str, kept)) or 'none (all its choices dropped)'}")


def _check_answer(what, rank, result, wanted):
    """What rank ``rank``'s solution returned, and its layer's output; (Failure, call)."""
    y, answer, arrivals = result
    tokens, routing, y_want, outputs = wanted[rank]
    rows, _, computed = arrivals[0]
    if answer is None or answer.shape != outputs.shape:
        got = "None" if answer is None else f"shape {answer.shape}"
        if answer is not None and answer.shape == computed.shape and \
                np.array_equal(answer, computed):
            return Failure("missing combine", (
                f"{what}: rank {rank} returned {got}, the outputs of its own experts for "
                f"the {computed.shape[0]} rows that arrived here (from every rank), not its "
                "tokens' outputs: the combine is missing. Send them back to where they came "
                "from, an all_to_all_single with the split sizes swapped, and put each row "
                f"back at its (token, choice): an array of shape {outputs.shape}"),
                rank=rank), None
        return Failure("wrong shape", (
            f"{what}: rank {rank} returned {got}, expected shape {outputs.shape}: "
            "(tokens, k, C), each kept choice's expert output, zeros for a dropped one"),
            rank=rank), None
    for t, w in np.ndindex(routing.choices.shape):
        got, want = answer[t, w], outputs[t, w]
        if same(got, want):
            continue
        if not routing.kept[t, w]:
            return Failure("wrong result", (
                f"{what}: rank {rank}'s choice {w} of token {t} was dropped (its expert "
                "was full), but you return an output for it: a dropped choice is not sent, "
                "and gets zeros"), rank=rank), 2
        if any(same(got, row) for row in outputs.reshape(-1, WIDTH)):
            return Failure("wrong place", (
                f"{what}: rank {rank}'s token {t}, choice {w} holds the output of another "
                "of its choices: the outputs come back in the order you sent the rows "
                "(grouped by destination); put row a back at the choice you sent as row a "
                "(undo the grouping)"), rank=rank), 2
        if any(same(got, row) for row, given in zip(computed, rows)
               if (whose_row(given, [tokens for tokens, *_ in wanted]) or (rank,))[0] != rank):
            return Failure("missing combine", (
                f"{what}: rank {rank}'s token {t}, choice {w} (expert "
                f"{routing.choices[t, w]}) holds an output its own experts computed for a "
                "row that arrived here: the combine is missing. The outputs go back to "
                "their sources, an all_to_all_single with the split sizes swapped"),
                rank=rank), 2
        return Failure("wrong result", (
            f"{what}: rank {rank}'s token {t}, choice {w} (expert "
            f"{routing.choices[t, w]}): element 0 is {got[0]:.6g}, expected "
            f"{want[0]:.6g}"), rank=rank), 2
    if not same(y, y_want):
        return Failure("wrong result", (
            f"{what}: rank {rank}'s layer output differs from the one-process MoE's on "
            "its tokens"), rank=rank), None
    return None, None


EXERCISE = Exercise(
    name="moe_dispatch", function="moe_dispatch",
    summary="expert parallelism: split sizes, the counts' and the tokens' all_to_all, the combine",
    lesson="lessons/19_experts.py", reference=moe_dispatch, check=check)
