"""The start banner: what a run is about to do, in a few aligned lines built from its
``run_start`` record (experiment, device, precision, model, schedule, the checkpoints kept,
model setup, seed).
"""

from __future__ import annotations

from collections.abc import Mapping

from core.callbacks import Record
from core.checks import is_int, is_number
from core.console.digest import lookup
from core.console.model_summary import format_model_summary
from core.console.units import format_count

__all__ = ("format_banner", "format_fields", "format_retention")


def format_fields(fields: list[tuple[str, str]]) -> str:
    """``label  value`` lines, the values aligned.

    >>> format_fields([("device", "cpu"), ("precision", "bf16")])
    'device     cpu\\nprecision  bf16'
    """
    width = max((len(label) for label, _ in fields), default=0)
    return "\n".join(f"{label.ljust(width)}  {value}".rstrip() for label, value in fields)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _strategy(record: Record) -> str | None:
    device = record.get("device") or lookup(record, "resolved", "strategy", "device")
    mode = lookup(record, "resolved", "strategy", "training_mode")
    world = lookup(record, "resolved", "strategy", "world_size")
    if not is_int(world):
        world = lookup(record, "plan", "world_size")
    extras = [
        f"training_mode {mode}" if mode else "",
        f"world size {world}" if is_int(world) else "",
    ]
    extra = ", ".join(e for e in extras if e)
    if device is None:
        return extra or None
    return f"{device} ({extra})" if extra else str(device)


def _parameters(record: Record) -> str | None:
    summary = record.get("model_summary")
    total = lookup(summary, "parameters")
    if not is_int(total):
        total = lookup(record, "resolved", "parameters")
    if not is_int(total):
        return None
    text = f"{format_count(total)} total"
    trainable = lookup(summary, "trainable")
    if is_int(trainable):
        text += f", {format_count(trainable)} trainable"
    details = [str(m) for m in [lookup(record, "resolved", "model")] if isinstance(m, str)]
    size = lookup(summary, "size_mb")
    if is_number(size):
        details.append(f"{size:.3f} MB")
    return f"{text} ({', '.join(details)})" if details else text


def _schedule(record: Record) -> str | None:
    plan = record.get("plan")
    epochs = lookup(plan, "max_epochs")
    if not is_int(epochs):
        epochs = lookup(record, "config", "run", "max_epochs")
    parts = [_plural(epochs, "epoch")] if is_int(epochs) else []
    if is_int(steps := lookup(plan, "max_steps")):
        parts.append(f"at most {_plural(steps, 'step')}")
    if is_int(per_epoch := lookup(plan, "steps_per_epoch")):
        parts.append(f"{per_epoch} steps/epoch")
    batches = lookup(plan, "batches_per_epoch")
    if is_int(batches) and batches != per_epoch:
        parts.append(f"{batches} batches/epoch")
    if is_int(batch := lookup(plan, "effective_batch_size")):
        parts.append(f"effective batch {batch}")
    return ", ".join(parts) or None


def _validation(record: Record) -> str | None:
    plan = record.get("plan")
    if not isinstance(plan, Mapping) or "has_validation" not in plan:
        return None
    if not plan.get("has_validation"):
        return "none"
    parts = []
    if is_int(every := plan.get("val_every_n_epochs")):
        parts.append(f"every {_plural(every, 'epoch')}")
    if is_int(every := plan.get("val_every_n_steps")):
        parts.append(f"every {_plural(every, 'step')}")
    if monitor := plan.get("monitor"):
        mode = plan.get("mode")
        parts.append(f"monitor {monitor}" + (f" ({mode})" if mode else ""))
    return ", ".join(parts) or "on"


def format_retention(run_start: Record) -> str | None:
    """What the run keeps of its checkpoints, from its ``run_start`` record (None where the
    record has none: an older run's), e.g. ``keeps the 2 best by val_loss (min) + the newest``.
    """
    settings = lookup(run_start, "resolved", "checkpoints")
    if not isinstance(settings, Mapping):
        return None
    if settings.get("saves") is False:
        return "nothing saved"
    top_k, newest = settings.get("top_k"), settings.get("keep_newest")
    if not (is_int(top_k) and is_int(newest)):
        return None
    kept = "the newest" if newest == 1 else f"the {newest} newest"
    monitor = settings.get("monitor")
    if top_k == -1:
        kept = f"every checkpoint scored by {monitor} + {kept}"
    elif top_k >= 1:
        best = "the best" if top_k == 1 else f"the {top_k} best"
        kept = f"{best} by {monitor} ({settings.get('mode')}) + {kept}"
    last = "; last -> newest" if settings.get("save_last") is True else ""
    return f"keeps {kept}{last}"


def _names(values: list[object], limit: int = 3) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", +{len(values) - limit} more" if len(values) > limit else "")


def _model_setup(record: Record) -> str | None:
    setup = lookup(record, "resolved", "model_setup")
    if not isinstance(setup, Mapping):
        return None
    parts = []
    if isinstance(compiled := setup.get("compiled"), list) and compiled:
        parts.append(f"compiled {_names(compiled)}")
    checkpointed = setup.get("activation_checkpointed")
    if isinstance(checkpointed, list) and checkpointed:
        blocks = _plural(len(checkpointed), "block")
        parts.append(f"activation checkpointing on {blocks} ({_names(checkpointed)})")
    if setup.get("channels_last") is True:
        parts.append("channels_last")
    if is_int(found := lookup(setup, "batch_size_search", "batch_size")):
        parts.append(f"batch size {found} (searched)")
    if is_int(micro := setup.get("micro_batch_size")):
        parts.append(f"micro-batch {micro}")
    return "; ".join(parts) or "no compile, checkpointing or channels_last"


def _seed(record: Record) -> str | None:
    run = lookup(record, "config", "run")
    if "seed" not in record and not (isinstance(run, Mapping) and "seed" in run):
        return None
    seed = record["seed"] if "seed" in record else lookup(run, "seed")
    return "none (not reproducible)" if seed is None else str(seed)


def _smoke_batches(record: Record) -> int | None:
    smoke = lookup(record, "config", "run", "fast_dev_run")
    if smoke is not True and not (is_int(smoke) and smoke >= 1):
        return None
    return 1 if smoke is True else int(smoke)


def _files_kept(record: Record) -> bool:
    return lookup(record, "config", "run", "keep_fast_dev_run_files") is True


def _smoke_run(record: Record) -> str | None:  # "1 train and 1 val batch, nothing saved"
    n = _smoke_batches(record)
    if n is None:
        return None
    noun = "batch" if n == 1 else "batches"
    both = lookup(record, "plan", "has_validation") is True
    what = f"{n} train and {n} val {noun}" if both else f"{n} train {noun}"
    return f"{what}, " + (
        "no checkpoint saved, run files kept" if _files_kept(record) else "nothing saved"
    )


def _run_dir(record: Record) -> str | None:
    """The run's directory; a ``fast_dev_run``'s is temporary unless its files are kept."""
    run_dir = record.get("run_dir")
    if run_dir and _smoke_batches(record) is not None and not _files_kept(record):
        return f"{run_dir} (temporary: removed when the run ends)"
    return str(run_dir) if run_dir else None


def _init(record: Record) -> str | None:
    digest = record.get("model_init_hash")
    if not isinstance(digest, str):
        return None
    same = record.get("model_init_matches_previous")
    note = {True: " (same as the previous run)", False: " (differs from the previous run)"}
    return digest[:12] + note.get(same, "") if isinstance(same, bool) else digest[:12]


def format_banner(run_start: Record) -> str:
    """The lines shown when a run starts; a field the record lacks leaves its line out
    (records of older runs have no ``plan`` or ``model_summary``).

    Example::

        format_banner({"event": "run_start", "device": "cpu", "precision": "bf16"})
        # 'device     cpu\\nprecision  bf16'
    """
    experiment = lookup(run_start, "config", "run", "experiment_name")
    run_id = run_start.get("run_id")
    name = " / ".join(str(part) for part in (experiment, run_id) if part)
    precision = run_start.get("precision") or lookup(
        run_start, "resolved", "precision", "resolved_precision"
    )
    note = lookup(run_start, "resolved", "precision", "note")
    if precision and isinstance(note, str):  # e.g. bf16 emulated by this CPU
        precision = f"{precision} (warning: {note})"
    candidates = [
        ("fast_dev_run", _smoke_run(run_start)),
        ("run", name or None),
        ("run dir", _run_dir(run_start)),
        ("device", _strategy(run_start)),
        ("precision", precision),
        ("parameters", _parameters(run_start)),
        ("schedule", _schedule(run_start)),
        ("validation", _validation(run_start)),
        ("checkpoints", format_retention(run_start)),
        ("model setup", _model_setup(run_start)),
        ("seed", _seed(run_start)),
        ("model init", _init(run_start)),
    ]
    text = format_fields([(label, str(value)) for label, value in candidates if value])
    summary = run_start.get("model_summary")
    if isinstance(summary, Mapping) and summary.get("modules"):
        text += "\n" + format_model_summary(summary)
    return text
