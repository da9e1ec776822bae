"""Known wrong: the outer step applied to the rank's inner weights, not the last-sync weights."""
import minidist.distributed as dist


def diloco_outer_step(weights, last_sync, momentum, lr, mu):
    delta = last_sync - weights
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    momentum *= mu
    momentum += delta
    weights -= lr * (delta + mu * momentum)   # from this rank's inner weights, not theta
    last_sync[...] = weights
