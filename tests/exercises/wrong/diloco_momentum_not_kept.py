"""Known wrong: the momentum rebound to a new array, so the caller's buffer never changes."""
import minidist.distributed as dist


def diloco_outer_step(weights, last_sync, momentum, lr, mu):
    delta = last_sync - weights
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    momentum = mu * momentum + delta          # a new array: the caller's buffer stays zero
    last_sync -= lr * (delta + mu * momentum)
    weights[...] = last_sync
