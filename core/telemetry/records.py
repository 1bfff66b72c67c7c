"""The run log's schema: every record type, defined once, and :data:`RECORDS` by event name.

Each record holds :class:`Common`'s fields, then its own; ``float | None`` is ``null`` when
unknown or not finite. No ``from __future__ import annotations``: checks read annotations.
"""

from typing import Annotated, Literal

from core.telemetry.compile_records import Compile, CompileDecision
from core.telemetry.device_records import GpuSample, MonitorDegraded, MonitorFieldUnsupported
from core.telemetry.record_common import Common, Level, NotRequired
from core.telemetry.stop_records import (
    ForcedExit,
    SignalReceived,
    StepThreadAbandoned,
    StepThreadParked,
)

__all__ = (
    "AmpCompatibility",
    "CallbackLagging",
    "Checkpoint",
    "Common",
    "Compile",
    "CompileDecision",
    "DataStall",
    "EpochEnd",
    "Error",
    "ForcedExit",
    "FreshStart",
    "GpuSample",
    "Level",
    "LogDegraded",
    "MonitorDegraded",
    "MonitorFieldUnsupported",
    "NonfiniteSkipped",
    "OomRecovered",
    "Pending",
    "PrecisionFallback",
    "Profile",
    "RECORDS",
    "Resumed",
    "RunEnd",
    "RunStart",
    "SignalReceived",
    "StepThreadAbandoned",
    "StepThreadParked",
    "TrainStep",
    "UnevenInputs",
    "Validation",
    "ValidationStart",
)

_Reason = Literal[
    "step",
    "epoch",
    "best",
    "top_k",
    "signal",
    "cancel",
    "stopped_by_peer",
    "error",
    "early_stop",
    "requested",
]
_Verdict = Literal["input_bound", "underutilised", "compute_bound"]
_Status = Literal["completed", "stopped", "cancelled", "failed", "abandoned"]
_ErrorKind = Literal[
    "checkpoint_invalid",
    "checkpoint_failed",
    "nonfinite_validation_loss",
    "callback_failed",
    "compile_failed",
    "best_checkpoint_missing",
]


class RunStart(Common):
    """Once, first, when the run has opened its directory (before resuming)."""

    config: Annotated[dict[str, object], "the config tree, every setting (as in config.json)"]
    resolved: Annotated[dict[str, object], "what the settings resolved to on this machine"]
    torch_version: Annotated[str, "torch.__version__"]
    python_version: Annotated[str, "the interpreter's version, e.g. 3.11.7"]
    device: Annotated[str, "this rank's torch device, e.g. cuda:0 or cpu"]
    precision: Annotated[str, "the precision steps start in: fp32, bf16 or fp16"]
    run_dir: Annotated[str, "the run's directory (log_dir, experiment, run_id)"]
    model_summary: Annotated[dict[str, object], "per top-level module: class, parameters..."]
    plan: Annotated[dict[str, object], "steps per epoch, effective batch, validation, best"]
    loaders: Annotated[
        dict[str, object], "train, val: rebuilt with data.loader's workers (settings) or why not"
    ]
    seed: Annotated[int | None, "run.seed (null: not seeded)"]
    model_init_hash: Annotated[str, "fingerprint of the weights before training (sampled)"]
    model_init_hash_method: Annotated[str, "how model_init_hash was computed"]
    model_init_matches_previous: Annotated[bool | None, "same as the experiment's last run"]


class FreshStart(Common):
    """Once, after run_start, when resume="auto" finds checkpoints but continues none."""

    path: Annotated[str, "the newest lineage's newest valid checkpoint, not continued"]
    reason: Annotated[
        Literal["finished", "incompatible", "unreadable"],
        "its run ended, it differs, or this version of core cannot read it",
    ]
    detail: Annotated[str, "what ended it, which settings or weights differ, or why unread"]
    passed_over: Annotated[
        list[dict[str, str]], "every lineage left alone, the newest first: path, reason, detail"
    ]


class Resumed(Common):
    """Once, after run_start, when the run continues from a checkpoint."""

    path: Annotated[str, "the checkpoint directory loaded"]
    step: Annotated[int, "optimizer steps the checkpoint had taken"]
    epoch: Annotated[int, "epochs the checkpoint had completed"]
    lineage: Annotated[str, "the lineage this run's checkpoints join (and are retained in)"]
    branched: Annotated[bool, "true: its lineage was not continued, this run began a new one"]
    branch_reason: Annotated[
        str | None, "why: the lineage has newer checkpoints, or another run holds it (pid, host)"
    ]
    passed_over: Annotated[
        list[dict[str, str]],
        'newer lineages resume="auto" left alone: path, reason (incompatible, finished, '
        "unreadable, held), detail",
    ]
    data_order: Annotated[
        Literal["restored", "not_restored"],
        "whether the rest of the run trains on the batches an uninterrupted one would",
    ]
    data_order_detail: Annotated[str | None, "not_restored: what core cannot restore, and why"]


class AmpCompatibility(Common):
    """Once per job, as its first epoch opens (check_compatibility): the model's AMP report."""

    compatible: Annotated[bool, "false: a blocker stops autocast from working"]
    device: Annotated[str, "the device checked"]
    dtype: Annotated[str, "the AMP precision checked: fp32, bf16 or fp16"]
    blockers: Annotated[list[str], "what fails under autocast: the modules and the fix"]
    warnings: Annotated[list[str], "what costs speed, memory or accuracy: modules and fix"]
    recommendations: Annotated[list[str], "the fixes, one per line"]
    notes: Annotated[list[str], "facts that need no action"]


class TrainStep(Common):
    """After every optimizer step (read back during the next one, so one step behind)."""

    epoch: Annotated[int, "the epoch, counted from 0"]
    step: Annotated[int, "optimizer steps so far, this one included"]
    loss: Annotated[float | None, "sample-weighted mean loss of the step's batches"]
    lr: Annotated[float, "learning rate of the first parameter group for this step"]
    grad_norm: Annotated[float | None, "total gradient norm (before clipping)"]
    loss_scale: Annotated[float | None, "fp16 loss scale used; null without a loss scaler"]
    overflow: Annotated[bool, "fp16 gradients overflowed (the step was skipped)"]
    skipped: Annotated[bool, "the optimizer step was not applied"]
    samples: Annotated[int, "samples in the step, all micro-batches"]
    step_time_s: Annotated[float, "seconds from asking for the batch to the step queued"]
    data_time_s: Annotated[float, "seconds of it spent waiting for the loader"]
    samples_per_s: Annotated[float | None, "samples / step_time_s"]
    accuracy: Annotated[float | None, "this rank's fraction correct; null unless class targets"]
    mem_allocated_bytes: Annotated[int | None, "torch allocator bytes in use; null on CPU"]
    max_mem_allocated_bytes: Annotated[int | None, "peak allocator bytes; null on CPU"]
    device_util_pct: Annotated[float | None, "latest gpu_sample util_pct of the first device"]
    device_mem_used_bytes: Annotated[int | None, "latest gpu_sample mem_used_bytes, likewise"]
    logged: NotRequired[Annotated[dict[str, float | None], "training_step's own values, means"]]
    moe_aux_loss: NotRequired[Annotated[float | None, "MoE: balance loss, layer mean (1: even)"]]
    moe_tokens_per_expert: NotRequired[Annotated[dict[str, list[int]], "MoE: layer -> per expert"]]
    moe_dropped_tokens: NotRequired[Annotated[int, "MoE: assignments dropped for capacity"]]


class NonfiniteSkipped(Common):
    """After train_step, for a step skipped because its loss or gradient norm was NaN/inf."""

    epoch: Annotated[int, "the epoch, counted from 0"]
    step: Annotated[int, "the skipped optimizer step"]
    loss: Annotated[float | None, "the step's loss (null: not finite)"]
    grad_norm: Annotated[float | None, "the step's gradient norm (null: not finite)"]


class OomRecovered(Common):
    """After an out-of-memory error in a step: the micro-batch was halved and the step retried."""

    epoch: Annotated[int, "the epoch, counted from 0"]
    step: Annotated[int, "the optimizer step being retried"]
    batch_index: Annotated[int, "the step's first loader batch in the epoch"]
    batch_size: Annotated[int, "the largest micro-batch that ran out of memory, samples"]
    micro_batch_size: Annotated[int, "the micro-batch size from now on, samples"]


class PrecisionFallback(Common):
    """When fp16 kept overflowing at amp_min_scale: later steps run in to_precision."""

    step: Annotated[int, "the step whose readback decided it"]
    from_precision: Annotated[str, "the precision left (fp16)"]
    to_precision: Annotated[str, "the precision from the next step: bf16, else fp32"]
    reason: Annotated[str, "why, in words"]


class UnevenInputs(Common):
    """Under several ranks with streamed loaders, when some ranks ran out: all end the epoch."""

    epoch: Annotated[int, "the epoch, counted from 0"]
    step: Annotated[int, "optimizer steps so far"]
    loader: Annotated[str, "which loader (train_loader)"]
    exhausted_ranks: Annotated[list[int], "the ranks that had no batch left"]
    unused_batches_at_least: Annotated[list[int], "batches each rank had in hand, by rank"]


class DataStall(Common):
    """Warning: the loader has not delivered a batch for data_stall_warn_s (again at 2x, 4x...)."""

    epoch: Annotated[int, "the epoch, counted from 0"]
    batch_index: Annotated[int, "the awaited batch (loader batches consumed this epoch)"]
    waited_s: Annotated[float, "seconds waited so far"]
    next_warning_after_s: Annotated[float, "seconds of waiting before the next warning"]
    advice: Annotated[str, "what to check, in words"]


class ValidationStart(Common):
    """Before each validation pass (val_every_n_epochs, val_every_n_steps)."""

    epoch: Annotated[int, "the epoch, counted from 0"]
    step: Annotated[int, "optimizer steps so far"]
    batches: Annotated[int | None, "batches in this rank's val_loader; null: unknown"]


class SanityCheck(Common):
    """Before the first training step: the num_sanity_val_steps validation batches ran."""

    epoch: Annotated[int, "the epoch training starts in, counted from 0"]
    step: Annotated[int, "optimizer steps so far"]
    batches: Annotated[int | None, "val_loader batches evaluated; null: unknown"]
    samples: Annotated[int, "validation samples counted"]
    val_loss: Annotated[float | None, "their mean loss; null: validation_step returns none"]
    time_s: Annotated[float, "seconds the check took"]


class Validation(Common):
    """After each validation pass."""

    epoch: Annotated[int, "the epoch, counted from 0"]
    step: Annotated[int, "optimizer steps so far"]
    val_loss: Annotated[
        float | None,
        "sample-weighted mean loss over every rank's samples; null: validation_step returns none",
    ]
    val_accuracy: Annotated[float | None, "fraction correct, 0 to 1; null unless class targets"]
    metrics: Annotated[dict[str, float | None], "the metrics= values, by name"]
    samples: Annotated[int, "validation samples counted"]
    cache_clears: Annotated[int, "device cache emptied (clear_cache_every_n_val_batches)"]


class EpochEnd(Common):
    """At the end of every completed epoch, after validation, with the bottleneck verdict."""

    epoch: Annotated[int, "the epoch, counted from 0"]
    step: Annotated[int, "optimizer steps so far"]
    train_loss: Annotated[float | None, "the epoch's mean training loss over all ranks"]
    val_loss: Annotated[float | None, "the latest validation loss; null without val_loader"]
    val_accuracy: Annotated[float | None, "the latest validation accuracy, 0 to 1"]
    val_metrics: Annotated[dict[str, float | None], "the latest metrics= values"]
    steps: Annotated[int, "optimizer steps in the epoch"]
    skipped_steps: Annotated[int, "of those, steps not applied (overflow or NaN/inf)"]
    samples: Annotated[int, "training samples of this rank in the epoch"]
    epoch_time_s: Annotated[float, "seconds of training in the epoch (validation excluded)"]
    data_time_s: Annotated[float, "seconds of it spent waiting for the loader"]
    samples_per_s: Annotated[float | None, "samples / epoch_time_s"]
    early_stopping_bad_epochs: Annotated[int, "checks in a row without improvement"]
    stopped_early: Annotated[bool, "early stopping ends the run after this epoch"]
    input_stall_fraction: Annotated[float, "data_time_s / epoch_time_s, 0 to 1"]
    util_mean_pct: Annotated[float | None, "mean gpu_sample util_pct over the epoch"]
    bottleneck: Annotated[_Verdict, "what limits speed"]
    bottleneck_advice: Annotated[str, "the verdict and what to do, in words"]
    amp: NotRequired[Annotated[dict[str, object], "log_amp_stats: get_amp_stats() then"]]


class Checkpoint(Common):
    """After a checkpoint is committed: periodic, at an epoch end, or when the run stops."""

    path: Annotated[str, "the checkpoint directory"]
    step: Annotated[int, "optimizer steps it holds"]
    epoch: Annotated[int, "epochs completed when it was written"]
    reason: Annotated[_Reason, "a schedule (step, epoch), a new best, or a stop (the others)"]
    best: Annotated[bool, "it holds the best monitored value so far (save_best)"]
    save_time_s: Annotated[float, "seconds the save took"]


class Error(Common):
    """Error: a failure reported as a record, not raised (its fields depend on kind)."""

    kind: Annotated[_ErrorKind, "which failure (the fields below name their kinds)"]
    path: NotRequired[Annotated[str, "checkpoint_invalid/best_checkpoint_missing: which"]]
    reason: NotRequired[Annotated[str, "checkpoint_invalid/_failed, compile_failed: why"]]
    last_checkpoint: NotRequired[Annotated[str | None, "checkpoint_failed: the last good one"]]
    epoch: NotRequired[Annotated[int, "nonfinite_validation_loss: the epoch, from 0"]]
    step: NotRequired[Annotated[int, "nonfinite_validation_loss: optimizer steps so far"]]
    val_loss: NotRequired[Annotated[float | None, "nonfinite_validation_loss: the loss"]]
    callback: NotRequired[Annotated[str, "callback_failed: the callback's class"]]
    hook: NotRequired[Annotated[str, "callback_failed: the hook that raised"]]
    event_type: NotRequired[Annotated[str | None, "callback_failed: the record it was given"]]
    error: NotRequired[Annotated[str, "callback_failed: the exception, type: message"]]
    traceback: NotRequired[Annotated[str, "callback_failed: its traceback, as Python prints it"]]
    effect: NotRequired[Annotated[str, "all but checkpoint_*: what follows"]]


class CallbackLagging(Common):
    """Warning, once per callback: it fell behind and lost its oldest records."""

    callback: Annotated[str, "the callback's class"]
    dropped: Annotated[int, "records it had lost when this was written"]
    effect: Annotated[str, "what follows, in words"]


class LogDegraded(Common):
    """Error, in events() only: a file of the run directory could not be written."""

    file: Annotated[str, "the file that failed"]
    reason: Annotated[str, "the OS error"]
    effect: Annotated[str, "what follows, in words"]


class RunEnd(Common):
    """Once, last, however the run ended (level error when failed or abandoned)."""

    status: Annotated[_Status, "how it ended"]
    epochs_completed: Annotated[int, "epochs completed"]
    global_step: Annotated[int, "optimizer steps taken"]
    best_metric: Annotated[float | None, "lowest loss early stopping saw (val, else train)"]
    events_dropped: Annotated[int, "records lost by events() consumers that fell behind"]
    error_type: NotRequired[Annotated[str, "on failure: the exception's class name"]]
    error: NotRequired[Annotated[str, "on failure: the exception's message"]]
    last_checkpoint: Annotated[str | None, "the last good checkpoint of the run"]
    elapsed_s: Annotated[float, "seconds from run_start to run_end"]
    samples_per_s: Annotated[float | None, "this rank's training samples / training time"]
    monitor: Annotated[str | None, "what save_best watched; null without save_best"]
    best_value: Annotated[float | None, "its best value"]
    best_checkpoint: Annotated[str | None, "the checkpoint holding it"]
    stop_reason: Annotated[str | None, "why a rule or a callback stopped it early; else null"]
    run_dir: Annotated[str | None, "the run's directory (null: a fast_dev_run's, removed)"]


class Pending(Common):
    """Under run.isolation='ray', while the run waits for the cluster to give it its actors
    (after 1 s, then every 10 s): run_id is empty, the run has not opened yet."""

    waiting_for: Annotated[str, "resources (not free now), or its actor to start"]
    asked: Annotated[dict[str, float], "what each actor asks for: CPU, GPU"]
    free: Annotated[dict[str, float], "the cluster's CPUs and GPUs free now"]
    total: Annotated[dict[str, float], "the cluster's CPUs and GPUs in all"]
    waited_s: Annotated[float, "seconds waited so far"]
    start_timeout_s: Annotated[float | None, "when waiting becomes an error (null: never)"]


class Profile(Common):
    """Once, when the profile_steps window completes: a torch.profiler trace was written."""

    trace: Annotated[str, "the Chrome trace (chrome://tracing, Perfetto)"]
    table_file: Annotated[str, "the top operators table, as text"]
    first_step: Annotated[int, "the first profiled optimizer step"]
    last_step: Annotated[int, "the last profiled optimizer step"]
    table: Annotated[str, "the top operators by self time"]


RECORDS: dict[str, type] = {
    "pending": Pending,
    "run_start": RunStart,
    "fresh_start": FreshStart,
    "resumed": Resumed,
    "amp_compatibility": AmpCompatibility,
    "compile": Compile,
    "compile_decision": CompileDecision,
    "sanity_check": SanityCheck,
    "train_step": TrainStep,
    "nonfinite_skipped": NonfiniteSkipped,
    "oom_recovered": OomRecovered,
    "precision_fallback": PrecisionFallback,
    "uneven_inputs": UnevenInputs,
    "data_stall": DataStall,
    "validation_start": ValidationStart,
    "validation": Validation,
    "epoch_end": EpochEnd,
    "profile": Profile,
    "checkpoint": Checkpoint,
    "gpu_sample": GpuSample,
    "monitor_degraded": MonitorDegraded,
    "monitor_field_unsupported": MonitorFieldUnsupported,
    "error": Error,
    "callback_lagging": CallbackLagging,
    "log_degraded": LogDegraded,
    "signal_received": SignalReceived,
    "step_thread_parked": StepThreadParked,
    "step_thread_abandoned": StepThreadAbandoned,
    "forced_exit": ForcedExit,
    "run_end": RunEnd,
}
"""Every record a run writes, by ``event`` name, in the order a run meets them."""
