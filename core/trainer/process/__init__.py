"""One ``train()`` in a supervised child process (``run.isolation="process"``) and the ranks of
a ``devices=N`` job: what crosses into the process, the shared memory tensors cross in, the
pipes, the supervisor, and how a process that died is explained."""
