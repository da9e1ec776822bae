"""Known wrong: the pseudo-gradient taken as theta_r - theta (its sign flipped)."""
import minidist.distributed as dist


def diloco_outer_step(weights, last_sync, momentum, lr, mu):
    delta = weights - last_sync            # the way the weights moved: the wrong sign
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    momentum *= mu
    momentum += delta
    last_sync -= lr * (delta + mu * momentum)
    weights[...] = last_sync
