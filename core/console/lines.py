"""One-line texts of single records: an epoch's results, and a warning, an error or a
notable event (resumed, compiled, out-of-memory recovered...) as a console shows them.
"""

from __future__ import annotations

from core.callbacks import Record
from core.checks import is_int, is_number
from core.console.summary import format_metrics
from core.console.units import format_count, format_duration, format_number

__all__ = ("NOTABLE_EVENTS", "epoch_label", "format_epoch_line", "format_event_line")

NOTABLE_EVENTS = frozenset(
    {
        "resumed",
        "fresh_start",
        "compile",
        "oom_recovered",
        "precision_fallback",
        "uneven_inputs",
        "nonfinite_skipped",
        "signal_received",
        "profile",
    }
)
"""Info-level events worth a line of their own (warnings and errors always get one)."""

_MESSAGE_FIELDS = ("error", "reason", "advice", "note", "effect")


def epoch_label(epoch: object, max_epochs: object) -> str:
    """``epoch 3/10`` for the record epoch 2 (records count epochs from 0).

    >>> epoch_label(2, 10), epoch_label(2, None)
    ('epoch 3/10', 'epoch 3')
    """
    shown = f"epoch {epoch + 1}" if is_int(epoch) else "epoch ?"
    return f"{shown}/{max_epochs}" if is_int(max_epochs) else shown


def format_epoch_line(record: Record, max_epochs: object = None) -> str:
    """An ``epoch_end`` record as one line: steps, losses, metrics, speed, time.

    Example::

        format_epoch_line({"epoch": 0, "step": 8, "train_loss": 0.73}, max_epochs=2)
        # 'epoch 1/2  step 8  train_loss 0.73'
    """
    parts = [epoch_label(record.get("epoch"), max_epochs)]
    if is_int(step := record.get("step")):
        parts.append(f"step {step}")
    parts.extend(format_metrics(record))
    if is_int(skipped := record.get("skipped_steps")) and skipped:
        parts.append(f"skipped {skipped}")
    if is_number(rate := record.get("samples_per_s")):
        parts.append(f"{format_count(rate)} samples/s")
    if is_number(seconds := record.get("epoch_time_s")):
        parts.append(f"time {format_duration(seconds)}")
    if record.get("stopped_early") is True:
        parts.append("(early stopping: last epoch)")
    return "  ".join(parts)


def _notable(record: Record) -> str | None:
    event = record.get("event")
    if event == "resumed":
        where = f"resumed from {record.get('path')} (step {record.get('step')})"
        return where + _lineage(record) + _data_order(record)
    if event == "fresh_start":
        passed = record.get("passed_over")
        older = len(passed) - 1 if isinstance(passed, list) and len(passed) > 1 else 0
        return (
            f"new run: resume='auto' left {record.get('path')} alone, {record.get('detail')} "
            f"{f'(and {older} older lineages, none continuable) ' if older else ''}"
            "(resume='strict' would continue it or fail)"
        )
    if event == "compile":
        breaks = record.get("graph_breaks")
        seconds = format_duration(record.get("seconds"))
        return f"compiled {record.get('target')} in {seconds} ({breaks} graph breaks)"
    if event == "oom_recovered":
        return (
            f"out of memory at step {record.get('step')}: micro-batch "
            f"{record.get('batch_size')} -> {record.get('micro_batch_size')}"
        )
    if event == "precision_fallback":
        return f"precision {record.get('from_precision')} -> {record.get('to_precision')}"
    if event == "nonfinite_skipped":
        loss = format_number(record.get("loss"))
        return f"step {record.get('step')} skipped: non-finite loss or gradient (loss {loss})"
    if event == "uneven_inputs":
        ranks = record.get("exhausted_ranks")
        return f"uneven inputs at step {record.get('step')}: ranks {ranks} ran out of batches"
    if event == "data_stall":
        waited = format_duration(record.get("waited_s"))
        return f"data_stall: no batch for {waited}: {record.get('advice')}"
    if event == "profile":
        return f"profile of steps {record.get('first_step')}-{record.get('last_step')}: " + (
            f"trace {record.get('trace')}, table {record.get('table_file')}"
        )
    return None


def format_event_line(record: Record) -> str | None:
    """One line for a warning or error record, or for a :data:`NOTABLE_EVENTS` record;
    ``None`` for other records.

    Example::

        format_event_line({"event": "data_stall", "level": "warning", "advice": "..."})
        # 'warning: data_stall: ...'
    """
    event, level = record.get("event"), record.get("level")
    if event == "run_end":  # the end summary reports it
        return None
    if level not in ("warning", "error") and event not in NOTABLE_EVENTS:
        return None
    head = f"{level}: " if level in ("warning", "error") else ""
    notable = _notable(record)
    if notable is not None:
        return head + notable
    kind = record.get("kind")
    name = str(event)
    if isinstance(kind, str):  # error records say what failed in their kind
        name = kind if event == "error" else f"{event}:{kind}"
    message = next((str(record[k]) for k in _MESSAGE_FIELDS if record.get(k)), "")
    for key in ("callback", "path", "file"):  # what the message is about
        if message and isinstance(subject := record.get(key), str):
            message = f"{subject}: {message}"
            break
    return f"{head}{name}: {message}" if message else head + name


def _data_order(record: Record) -> str:
    """What a resume says when its batches may differ from an uninterrupted run's."""
    if record.get("data_order") != "not_restored":
        return ""
    return f"; the data order is not restored: {record.get('data_order_detail')}"


def _lineage(record: Record) -> str:
    """What a resume says about lineages: a branch, and the newer ones passed over."""
    said = ""
    if record.get("branched"):
        why = record.get("branch_reason") or "its own lineage has newer checkpoints"
        said = f", in a new lineage: {why}"
    passed = record.get("passed_over")
    if isinstance(passed, list) and passed and isinstance(passed[0], dict):
        said += f"; passed over {len(passed)} newer lineage(s): {passed[0].get('detail')}"
    return said
