import minidist.distributed as dist


def quorum_allreduce(gradients, group, members, failed_ranks):
    for gradient in gradients:
        dist.all_reduce(gradient, group=group)  # a PeerGoneError leaves the function
    for gradient in gradients:
        gradient /= len(members)
    return True
