"""Known wrong: plain (heavy-ball) momentum, update = buf, for Nesterov's g + mu buf."""
import minidist.distributed as dist


def diloco_outer_step(weights, last_sync, momentum, lr, mu):
    delta = last_sync - weights
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    momentum *= mu
    momentum += delta
    last_sync -= lr * momentum                # heavy ball: no look-ahead
    weights[...] = last_sync
