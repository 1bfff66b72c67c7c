"""The synchronous work around a run's epochs, done on the step thread: opening and closing
the run, the plan it announces, validation, and what follows each check of the monitored
value."""
