"""torch.distributed.tensor's place in minidist: only its ``parallel``
package (:mod:`minidist.distributed.tensor.parallel`, ``parallelize_module``
and the styles). There is no DTensor: a split module holds plain shards and
its forward calls the collectives itself (:mod:`minidist.parallel.tensor_parallel`)."""
