"""Batching on a worker: which texts go through the model together, and when.

The whole rule, in the order a text meets it:

1. The scheduler leases a worker's work: a batch pull takes whole work
   items (a few hundred to a few thousand rows each); an online pull takes
   every waiting request of one model, at most the model spec's
   ``max_batch_size`` at a time (each request has a text or more, so that
   is a forward batch's worth), and never more than ``MAX_ONLINE_BATCH``
   (512, configs): ``ModelSpec.online_batch``; a worker that measured its
   rounds asks for what it computes in ``Profile.online_round_seconds``
   (`round_sizes`), fewer on a small CPU. Another pull takes the rest.
2. One batch item computes at a time on a worker (pull_loop); the next
   item's input is read meanwhile. Online requests wait in `online_groups`:
   each round takes every request of a loaded model that is waiting when the
   round gets the device, and answers them with one model call per model and
   operation (continuous batching: what arrived while the last round ran
   rides on the next).
3. A model call's texts are sorted by token length and cut into forward
   batches of at most ``token_budget`` padded tokens (batch size x longest
   text) and ``max_batch_size`` texts (the catalog entry's or the profile's
   values), and on a CPU, where a forward costs its padded tokens, of
   texts at least ``CPU_SIMILAR_LENGTHS`` (0.7) of the batch's longest:
   `token_batching.plan_batches`, run by
   `token_batching.BatchedRuntime.in_batches` for every runtime.
4. Every forward batch is one turn of the worker's one device thread
   (`device_thread`): online work waiting when a turn ends runs next, ahead
   of the rest of a batch item; nothing is preempted mid-batch.
"""
