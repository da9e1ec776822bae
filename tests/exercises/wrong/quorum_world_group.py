import minidist.distributed as dist


def quorum_allreduce(gradients, group, members, failed_ranks):
    try:
        for gradient in gradients:
            dist.all_reduce(gradient)  # the world group: the spare never calls it
    except dist.PeerGoneError:
        return False
    for gradient in gradients:
        gradient /= len(members)
    return True
