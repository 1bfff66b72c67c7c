"""The async shell and what it composes, one subpackage per job, each importing only those
listed before it: ``state`` (what a run holds and returns), ``epochs`` (the step thread's
work around epochs), ``assembly`` (the composition root), ``running`` (one ``train()`` in
this process), ``process`` (one ``train()`` in a supervised child process, and ``devices=N``),
``job`` (the training job users hold)."""
