"""Known wrong: each rank's own pseudo-gradient, never averaged over the ranks."""
def diloco_outer_step(weights, last_sync, momentum, lr, mu):
    delta = last_sync - weights               # this rank's own, never all-reduced
    momentum *= mu
    momentum += delta
    last_sync -= lr * (delta + mu * momentum)
    weights[...] = last_sync
