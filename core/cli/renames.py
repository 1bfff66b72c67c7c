"""The command line's own names for the leaves whose flat keyword reads ambiguously there.
``monitor`` is the checkpoint's metric in Python, but beside ``--monitor-gpu`` it would read as
the GPU monitor, so it is ``--checkpoint-monitor`` (likewise ``--gpu-monitor-interval-s``); the
old spellings still work, as aliases the help names once."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("RENAMES", "Rename", "SECTION_NOTES")


@dataclass(frozen=True)
class Rename:
    """``flag`` sets the leaf; ``aliases`` are the older spellings, which still do."""

    flag: str
    aliases: tuple[str, ...]
    help: str


RENAMES: dict[str, Rename] = {
    "checkpoint.monitor": Rename(
        "--checkpoint-monitor",
        ("--monitor",),
        "the metric that ranks checkpoints for --save-best and --save-top-k (and that early "
        "stopping watches unless --early-stopping-monitor says otherwise): val_loss, "
        "train_loss, val_accuracy or val_<metric>; not the GPU monitor.",
    ),
    "checkpoint.mode": Rename(
        "--checkpoint-mode",
        ("--mode",),
        "min: a lower --checkpoint-monitor is better; max: a higher one.",
    ),
    "monitor.enabled": Rename(
        "--gpu-monitor",
        ("--monitor-enabled",),
        "sample the device during the run (gpu_sample records; --no-gpu-monitor: none, and "
        "no NVML session).",
    ),
    "monitor.interval_s": Rename(
        "--gpu-monitor-interval-s",
        ("--monitor-interval-s",),
        "seconds between the GPU monitor's samples (0.1 is cheap: a sample costs microseconds).",
    ),
    "monitor.history_size": Rename(
        "--gpu-monitor-history-size",
        ("--monitor-history-size",),
        "samples the GPU monitor keeps in memory, the oldest dropped first.",
    ),
}
"""Dotted path -> its command-line name, older spellings and help."""

SECTION_NOTES: dict[str, str] = {
    "checkpoint": "What is saved, how often, and which checkpoints are kept; "
    "--checkpoint-monitor names the metric that ranks them.",
    "monitor": "The GPU monitor: samples of the device's utilisation and memory (NVML; the "
    "CPU through psutil without a GPU). Not the checkpoint's metric: that is "
    "--checkpoint-monitor.",
}
"""Section -> the description of its group in ``--help`` (else its docstring's first
sentence)."""
