"""Known wrong: the pseudo-gradients all-reduced but not divided by the world size."""
import minidist.distributed as dist


def diloco_outer_step(weights, last_sync, momentum, lr, mu):
    delta = last_sync - weights
    dist.all_reduce(delta)                    # the sum, never divided
    momentum *= mu
    momentum += delta
    last_sync -= lr * (delta + mu * momentum)
    weights[...] = last_sync
