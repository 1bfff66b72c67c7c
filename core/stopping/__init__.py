"""Early stopping: its config section, its rules, and the judge that asks them in turn."""
