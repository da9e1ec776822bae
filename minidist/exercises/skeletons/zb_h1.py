"""Exercise zb_h1: fill 1F1B's bubble with the weight halves of the backward.

Check it with `minidist exercise check zb_h1 zb_h1.py`: the checker runs
your orders on the pipeline simulator against ZB-H1 (Qi et al., "Zero
Bubble Pipeline Parallelism", ICLR 2024), then on real processes, and
draws your Gantt chart above ZB-H1's.

A stage's backward computes two things. Its input half "I<k>" is the
gradient of the stage's input: the stage before waits for it. Its weight
half "W<k>" is the gradient of the stage's weights: nobody waits for it,
only the optimizer step at the end of the batch needs it. Until its W has
run, a micro-batch's activations stay held on the stage (from its forward
"F<k>" to its W).

A schedule here is pure data, as in the one_f_one_b exercise: for each rank
(stage) of the pipeline, the order of its F's, I's and W's. The messages
are added for you: a forward on rank r > 0 first waits for its activation
from rank r - 1, an I on rank r < p - 1 first waits for its gradient from
rank r + 1. A W waits for nothing and sends nothing.
"""

from minidist.exercises import NotWrittenYet


def place_weights(orders: list[list[str]]) -> list[list[str]]:
    """Given 1F1B's order on every rank with each backward's two halves
    kept together, return the orders with the W's placed to fill the
    bubble. For 3 stages and 4 micro-batches you get (rank 0 first):

        [["F0", "F1", "F2", "I0", "W0", "F3", "I1", "W1", "I2", "W2", "I3",
          "W3"],
         ["F0", "F1", "I0", "W0", "F2", "I1", "W1", "F3", "I2", "W2", "I3",
          "W3"],
         ["F0", "I0", "W0", "F1", "I1", "W1", "F2", "I2", "W2", "F3", "I3",
          "W3"]]

    p = len(orders) ranks; rank r's order is orders[r]; each micro-batch
    k = 0..m-1 appears once as "F<k>", once as "I<k>", once as "W<k>".

    The rules: keep every F and I where it is (1F1B's order); run every W
    once, after its own I. Only where the W's go is yours: each W can wait,
    and while it waits the I's behind it travel back sooner, and it can
    fill a moment where its rank would otherwise wait for a message.

    What to reach (the checker measures both on the simulator, with
    F = I = W = 1 time unit and with F = I = 2, W = 1, and p = 1..6,
    m = 1..8, m < p too):

    * the batch as short as ZB-H1's: m(F+I+W) + (p-1)(F+I-W) when m >= p
      (with the halves together it is (m+p-1)(F+I) + mW: (p-1)W more);
    * and no rank holding more than min(p, m) micro-batches' activations at
      once, what 1F1B's first stage already holds. W's left to the very
      end fill nothing and hold all m.

    Hints: in 1F1B, where does rank r idle? How many W's can rank r keep
    waiting before it holds more than p micro-batches?
    """
    raise NotWrittenYet("write place_weights: each rank's order, its W's moved")
