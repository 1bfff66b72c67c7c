"""One ``train()`` in this process: the step thread, the coroutines beside it, callbacks fed
on the event loop, signals, and how the run stops and its ranks agree on the ending."""
