"""What a run leaves: the JSONL run log, the event hub behind ``events()``, the record
schema and the description of a job (``config.json``, ``run_start``)."""
