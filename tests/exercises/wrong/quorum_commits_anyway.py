import minidist.distributed as dist


def quorum_allreduce(gradients, group, members, failed_ranks):
    try:
        for gradient in gradients:
            dist.all_reduce(gradient, group=group)
    except dist.PeerGoneError:
        pass  # the step goes on, with whatever the all_reduce left
    for gradient in gradients:
        gradient /= len(members)
    return True
