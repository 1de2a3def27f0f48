"""The worker side: the model pool, runtimes, tokenizing and batching, the device thread, the stream to the
scheduler, and workers killed, frozen or retired."""
