import minidist.distributed as dist


def quorum_allreduce(gradients, group, members, failed_ranks):
    try:
        for gradient in gradients:
            dist.all_reduce(gradient, group=group)
    except dist.PeerGoneError:
        return False
    if failed_ranks() & set(members):
        return False
    for gradient in gradients:
        gradient /= dist.get_world_size()  # the world, not the live quorum
    return True
