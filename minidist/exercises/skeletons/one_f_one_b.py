"""Exercise one_f_one_b: write the 1F1B pipeline schedule, as data.

Check it with `minidist exercise check one_f_one_b one_f_one_b.py`: the
checker runs your schedule on the pipeline simulator and draws its Gantt
chart above the reference's.

A schedule here is pure data: for each stage (rank) of the pipeline, the
order in which it runs forwards "F<k>" and backwards "B<k>" of the
micro-batches k = 0..m-1. The messages are added for you: a forward on
stage s > 0 first waits for micro-batch k's activation from stage s - 1,
a backward on stage s < p - 1 first waits for its gradient from stage s + 1.
"""

from minidist.exercises import NotWrittenYet


def one_f_one_b(stages: int, microbatches: int) -> list[list[str]]:
    """Each stage's order of forwards and backwards under 1F1B, e.g. for
    2 stages and 3 micro-batches:

        [["F0", "F1", "B0", "F2", "B1", "B2"],    # stage 0
         ["F0", "B0", "F1", "B1", "F2", "B2"]]    # stage 1

    1F1B (one forward, one backward): stage s first runs a warm-up of
    min(p - s - 1, m) forwards; then, while forwards are left, one forward
    and then the backward of the oldest micro-batch not yet backwarded;
    then the backwards left (cool-down).

    What to reach (the checker measures both on the simulator, forward 1
    unit, backward 2): the batch takes (m + p - 1)(f + b), as GPipe does,
    but stage s never holds the activations of more than min(p - s, m)
    micro-batches at once (GPipe holds all m). Any p >= 1, m >= 1, m < p too.
    """
    raise NotWrittenYet("write one_f_one_b: return one list of 'F<k>'/'B<k>' per stage")
