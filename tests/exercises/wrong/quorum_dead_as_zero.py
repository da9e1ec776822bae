import minidist.distributed as dist


def quorum_allreduce(gradients, group, members, failed_ranks):
    try:
        for gradient in gradients:
            dist.all_reduce(gradient, group=group)
    except dist.PeerGoneError:
        return False
    if failed_ranks() & set(members):
        return False
    # the dead replicas counted too, as if each had sent a zero gradient
    for gradient in gradients:
        gradient /= len(members) + len(failed_ranks())
    return True
