"""Checkpoints: when and what to save and how to resume (checkpointer), and the atomic,
verified store beneath it (staging, fsync, rename, sha256 manifest)."""
