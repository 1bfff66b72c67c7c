"""``ProgressBar``: the run on a console, from its records. On a terminal, a tqdm bar per
epoch (with the ETA) and one per validation; elsewhere (a log file, CI), one plain line per
epoch. Both show the start banner, warnings and errors, and the end summary. Rank 0 only.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Literal, TextIO

from tqdm import tqdm
from typing_extensions import override

from core.callbacks import Callback, Record, RunInfo
from core.checks import is_int, is_number
from core.console.banner import format_banner
from core.console.digest import RunDigest, lookup
from core.console.lines import epoch_label, format_epoch_line, format_event_line
from core.console.summary import format_metrics, format_summary
from core.console.units import format_count, format_number, format_percent
from core.errors import config_error

__all__ = ("ProgressBar", "ProgressMode")

ProgressMode = Literal["auto", "bar", "lines"]
_MODES = ("auto", "bar", "lines")
# A record missing a field, or holding one of the wrong type, is skipped, not raised on.
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, ArithmeticError)


class ProgressBar(Callback):
    """Shows a run on ``file`` (``None``: ``sys.stderr`` when the run starts).

    ``mode="auto"`` draws bars when ``file`` is a terminal and writes plain lines (no
    carriage returns) otherwise; ``"bar"`` and ``"lines"`` force one or the other. The
    epoch bar's ``loss`` is the epoch's running mean (of this rank's steps), ``samples/s``
    the epoch's so far. Only the global rank 0 writes.
    """

    def __init__(self, *, file: TextIO | None = None, mode: ProgressMode = "auto") -> None:
        if mode not in _MODES:
            raise config_error("mode", mode, "'auto', 'bar' or 'lines'", "use mode='auto'.")
        self._file, self._mode = file, mode
        self._start(None)

    def _start(self, run_start: Record | None) -> None:
        """Forget the previous run (a callback may observe several runs, one after another)."""
        for bar in (getattr(self, "_train", None), getattr(self, "_val", None)):
            if bar is not None:
                bar.close()
        self._out: TextIO = self._file if self._file is not None else sys.stderr
        isatty = getattr(self._out, "isatty", None)
        self._bars = self._mode == "bar" or (self._mode == "auto" and bool(isatty and isatty()))
        self._digest = RunDigest(run_start=run_start)
        plan = lookup(run_start, "plan")
        self._max_epochs = lookup(plan, "max_epochs")
        if not is_int(self._max_epochs):
            self._max_epochs = lookup(run_start, "config", "run", "max_epochs")
        self._steps_per_epoch = lookup(plan, "steps_per_epoch")
        self._step_validation = is_int(lookup(plan, "val_every_n_steps"))
        self._train: Any = None  # tqdm bars
        self._val: Any = None
        self._epoch: int | None = None
        # The next epoch (when known) starts after that step (when known).
        self._next_epoch: object = 0
        self._next_base: int | None = 0
        self._base = 0
        self._loss_sum = self._loss_samples = self._samples = 0.0
        self._hits = self._hit_samples = 0.0  # the epoch's accuracy, sample-weighted
        self._seconds = 0.0
        self._postfix: list[str] = []

    @override
    async def on_record(self, run: RunInfo, record: Record) -> None:
        if not run.is_global_zero:
            return
        with contextlib.suppress(*_MALFORMED):  # a record this version cannot read is
            self._handle(record)  # not worth a failed callback

    def _handle(self, record: Record) -> None:
        event = record.get("event")
        if event == "run_start":
            self._start(record)
            self._write(format_banner(record))
            return
        self._digest.update(record)
        if event == "train_step":
            if self._bars:
                self._advance(record)
        elif event == "validation_start":
            # Validation inside an epoch gets a line (see _validated): closing the epoch's
            # bar for it would split the epoch over several bars.
            if self._bars and not self._step_validation:
                self._open_validation(record)
        elif event == "validation":
            self._validated(record)
        elif event == "epoch_end":
            self._epoch_end(record)
        elif event == "resumed":
            self._next_epoch, self._next_base = record.get("epoch"), None
            self._write_event(record)
        elif event == "run_end":
            self._close_bars()
            self._write(format_summary(record, self._digest))
        else:
            self._write_event(record)

    def _write_event(self, record: Record) -> None:
        line = format_event_line(record)
        if line is not None:
            self._write(line)

    def _write(self, text: str) -> None:
        if self._bars:
            tqdm.write(text, file=self._out)
        else:
            self._out.write(text + "\n")
        flush = getattr(self._out, "flush", None)
        if flush is not None:
            flush()

    def _bar(self, desc: str, total: object, unit: str) -> Any:
        total = total if is_int(total) and total > 0 else None
        return tqdm(total=total, desc=desc, file=self._out, unit=unit, leave=True, disable=False)

    def _train_bar(self, epoch: int, step: int) -> Any:
        if self._train is not None and self._epoch == epoch:
            return self._train
        self._close_bars()
        if self._next_epoch == epoch and self._next_base is not None:
            self._base = self._next_base
        elif is_int(self._steps_per_epoch):  # resumed: epochs before this one were full
            self._base = epoch * self._steps_per_epoch
        else:
            self._base = step - 1
        self._epoch = epoch
        self._loss_sum = self._loss_samples = self._samples = self._seconds = 0.0
        self._hits = self._hit_samples = 0.0
        label = epoch_label(epoch, self._max_epochs)
        self._train = self._bar(label, self._steps_per_epoch, "step")
        return self._train

    def _advance(self, record: Record) -> None:
        epoch, step = record.get("epoch"), record.get("step")
        if not (is_int(epoch) and is_int(step)):
            return
        bar = self._train_bar(epoch, step)
        samples, loss = record.get("samples"), record.get("loss")
        if is_number(samples):
            self._samples += samples
            if is_number(loss):
                self._loss_sum += loss * samples
                self._loss_samples += samples
            if is_number(accuracy := record.get("accuracy")):
                self._hits += accuracy * samples
                self._hit_samples += samples
        if is_number(seconds := record.get("step_time_s")):
            self._seconds += seconds
        postfix = []
        if self._loss_samples:
            postfix.append(f"loss={format_number(self._loss_sum / self._loss_samples)}")
        if self._hit_samples:
            postfix.append(f"accuracy={format_percent(self._hits / self._hit_samples)}")
        if is_number(lr := record.get("lr")):
            postfix.append(f"lr={lr:.2e}")
        logged = record.get("logged")  # a training_step's own values, this step's
        if isinstance(logged, dict):
            postfix += [f"{k}={format_number(v)}" for k, v in logged.items() if is_number(v)]
        if self._seconds > 0:
            postfix.append(f"samples/s={format_count(self._samples / self._seconds)}")
        self._postfix = postfix
        bar.set_postfix_str(", ".join(postfix), refresh=False)
        # The record's step, not a count of records: a dropped record does not desync.
        bar.update(max(step - self._base - bar.n, 0))

    def _open_validation(self, record: Record) -> None:
        if self._train is not None:
            self._train.close()
            self._train = None
        if self._val is not None:
            self._val.close()
        label = epoch_label(record.get("epoch"), self._max_epochs)
        self._val = self._bar(f"{label} val", record.get("batches"), "batch")

    def _validated(self, record: Record) -> None:
        texts = format_metrics(record)
        if self._bars and self._val is not None:
            bar, self._val = self._val, None
            bar.set_postfix_str(", ".join(t.replace(" ", "=", 1) for t in texts), refresh=False)
            bar.update(bar.total - bar.n if bar.total is not None else 0)
            bar.close()
        elif self._bars or self._step_validation:  # no bar to show it (older runs) or
            # validation inside epochs: the epoch line would show only the latest one
            label = epoch_label(record.get("epoch"), self._max_epochs)
            self._write(f"{label} val  step {record.get('step')}  " + "  ".join(texts))

    def _epoch_end(self, record: Record) -> None:
        epoch, step = record.get("epoch"), record.get("step")
        if is_int(epoch) and is_int(step):
            self._next_epoch, self._next_base = epoch + 1, step
        if not self._bars:
            self._write(format_epoch_line(record, self._max_epochs))
            return
        if self._train is not None and is_number(loss := record.get("train_loss")):
            # The epoch's loss over every rank replaces this rank's running mean.
            rest = [text for text in self._postfix if not text.startswith("loss=")]
            postfix = ", ".join([f"loss={format_number(loss)}", *rest])
            self._train.set_postfix_str(postfix, refresh=False)
        self._close_bars()
        if record.get("stopped_early") is True:
            bad = record.get("early_stopping_bad_epochs")
            self._write(f"early stopping: no improvement for {bad} epochs")

    def _close_bars(self) -> None:
        for bar in (self._train, self._val):
            if bar is not None:
                bar.close()
        self._train = self._val = None
