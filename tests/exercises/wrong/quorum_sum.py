import minidist.distributed as dist


def quorum_allreduce(gradients, group, members, failed_ranks):
    try:
        for gradient in gradients:
            dist.all_reduce(gradient, group=group)  # the sum, never divided
    except dist.PeerGoneError:
        return False
    return not failed_ranks() & set(members)
