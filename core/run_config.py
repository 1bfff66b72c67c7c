"""The run's own section of the config tree: its name, its length, where it writes, how it
stops (``TrainingConfig.run``; re-exported by :mod:`core.config` and :mod:`core`)::

    RunConfig(experiment_name="email_sequence", max_epochs=3, seed=0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from core.checks import check_bool_fields, is_finite_number, is_int, is_path
from core.errors import config_error
from core.flat_keyword import flat

__all__ = ("RunConfig",)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What the run is called, how long it trains, where it writes, how it stops.

    Training ends after ``max_epochs`` or ``max_steps`` optimizer steps, whichever comes
    first (the epoch ``max_steps`` ends in counts as completed). With a ``val_loader``,
    validation runs after every ``val_every_n_epochs``-th epoch and every
    ``val_every_n_steps`` optimizer steps (either None: not on that schedule). ``seed``
    seeds every generator when the run opens; ``deterministic=True`` also turns on torch's
    deterministic algorithms (seed the model's construction yourself with
    :func:`core.seed_everything` before building it).

    ``handle_signals=True`` turns SIGTERM/SIGINT into a graceful stop (scripts that own
    their process want it). A stop waits at most ``stop_grace_s`` for a running step to
    end; past that the run is abandoned (``run_end`` status ``abandoned``, naming the last
    good checkpoint). A stop that finds the step thread waiting for the train loader (outside
    any step) waits at most ``loader_grace_s`` for it, then parks the thread at that step
    boundary and writes the stop checkpoint from there (several ranks, which must vote and
    checkpoint together: the loader gets ``stop_grace_s`` as a step does). A
    loader that has not delivered a batch for ``data_stall_warn_s`` gets a ``data_stall``
    warning record, repeated with backoff.

    ``isolation``: the step loop runs in a worker thread (``"thread"``) or in a supervised
    child process (``"process"``: a service that must never flinch; ``core.trainer.process``)
    or in an actor of a Ray cluster (``"ray"``, placed as the ``ray`` section says:
    ``core.trainer.cluster``).

    ``limit_train_batches`` caps the batches each epoch trains on (``limit_val_batches``: each
    validation evaluates): an int ``n`` takes the loader's first ``n`` batches, a float in
    (0, 1] that fraction of them (``int(len(loader) * fraction)``), None all of them. The
    plan (steps per epoch, progress totals, the ``onecycle``/``cosine`` schedules of
    ``core-train``) counts the limited epoch; a short last accumulation window still steps.

    ``fast_dev_run=True`` (or an int ``n``) is a smoke run: 1 (``n``) train and 1 (``n``)
    val batch through every part and hook, in one epoch, and nothing saved (no checkpoint of
    any kind is written, none is resumed from: a later ``resume="auto"`` run starts fresh).
    It wins over ``max_epochs``, ``max_steps``, the limits, the validation schedule and the
    sanity check (:meth:`for_run`). Records still reach ``events()``, callbacks and
    trackers, and the console prints, marked by ``config.run.fast_dev_run`` in ``run_start``
    and a ``fast_dev_run`` console line; but the run directory (``events.jsonl``, ``config.json``,
    ``amp_stats.json``, a profiler trace) lives in a temporary folder removed when the run
    ends, so ``log_dir`` is left as it was: no reports, ``results.run_dir`` and ``run_end``'s
    ``run_dir`` are None (``run.run_dir`` names the temporary folder while the run lasts).

    ``num_sanity_val_steps`` (Lightning's name and default, 2) validates on that many
    ``val_loader`` batches before the first training step of every ``train()`` call, so a
    broken ``validation_step``, loss or metric fails at step 0 instead of after an epoch; it
    leaves no trace but a ``sanity_check`` record (weights, RNG streams, metrics history, best
    checkpoint and early stopping are as without it); 0 turns it off. It costs that many
    batches' forward passes, once per ``train()``.

    ``clear_cache_every_n_val_batches``: a validation empties the device's caching allocator
    after every that many batches (in long evaluations: memory another process may use,
    less fragmentation with uneven batches); each costs a device sync
    and later re-allocations, so shorter validations never pay it; None: never. A no-op on CPU
    (still counted: the ``validation`` record's ``cache_clears``).

    ``keep_fast_dev_run_files=True`` keeps a smoke run's files: its run directory is
    written under ``log_dir`` as any run's, reports included (still no checkpoint). It does
    nothing for other runs.

    >>> RunConfig(fast_dev_run=True, max_epochs=5).for_run().max_epochs
    1
    """

    experiment_name: str = field(default="experiment", metadata=flat("experiment_name"))
    max_epochs: int = field(default=10, metadata=flat("max_epochs"))
    max_steps: int | None = field(default=None, metadata=flat("max_steps"))
    val_every_n_epochs: int | None = field(default=1, metadata=flat("val_every_n_epochs"))
    val_every_n_steps: int | None = field(default=None, metadata=flat("val_every_n_steps"))
    seed: int | None = field(default=None, metadata=flat("seed"))
    deterministic: bool = field(default=False, metadata=flat("deterministic"))
    log_dir: str | Path = field(default="logs", metadata=flat("log_dir"))
    handle_signals: bool = field(default=False, metadata=flat("handle_signals"))
    stop_grace_s: float = field(default=30.0, metadata=flat("stop_grace_s"))
    loader_grace_s: float = field(default=1.0, metadata=flat("loader_grace_s"))
    data_stall_warn_s: float = field(default=10.0, metadata=flat("data_stall_warn_s"))
    isolation: Literal["thread", "process", "ray"] = field(
        default="thread", metadata=flat("isolation")
    )
    fast_dev_run: bool | int = field(default=False, metadata=flat("fast_dev_run"))
    keep_fast_dev_run_files: bool = field(default=False, metadata=flat("keep_fast_dev_run_files"))
    limit_train_batches: int | float | None = field(
        default=None, metadata=flat("limit_train_batches")
    )
    limit_val_batches: int | float | None = field(default=None, metadata=flat("limit_val_batches"))
    num_sanity_val_steps: int = field(default=2, metadata=flat("num_sanity_val_steps"))
    clear_cache_every_n_val_batches: int | None = field(
        default=100, metadata=flat("clear_cache_every_n_val_batches")
    )

    def __post_init__(self) -> None:
        if not (isinstance(self.experiment_name, str) and _SAFE_NAME.match(self.experiment_name)):
            raise config_error(
                "experiment_name",
                self.experiment_name,
                "a non-empty name of letters, digits, '.', '_' or '-' (it becomes a folder)",
            )
        if not (is_int(self.max_epochs) and self.max_epochs >= 1):
            raise config_error("max_epochs", self.max_epochs, "an integer >= 1")
        for name in (
            "max_steps",
            "val_every_n_epochs",
            "val_every_n_steps",
            "clear_cache_every_n_val_batches",
        ):
            value = getattr(self, name)
            if value is not None and not (is_int(value) and value >= 1):
                raise config_error(name, value, "None or an integer >= 1")
        if not (is_int(self.num_sanity_val_steps) and self.num_sanity_val_steps >= 0):
            raise config_error(
                "num_sanity_val_steps",
                self.num_sanity_val_steps,
                "an integer >= 0 (0: no sanity check)",
                "pass num_sanity_val_steps=2 to validate 2 batches before training, 0 to skip it.",
            )
        if self.seed is not None and not (is_int(self.seed) and self.seed >= 0):
            raise config_error("seed", self.seed, "None or an integer >= 0")
        if not is_path(self.log_dir):
            raise config_error(
                "log_dir", self.log_dir, "a non-empty str or pathlib.Path", "e.g. log_dir='logs'."
            )
        check_bool_fields(self)
        for name in ("stop_grace_s", "loader_grace_s", "data_stall_warn_s"):
            seconds = getattr(self, name)
            if not (is_finite_number(seconds) and seconds > 0):
                raise config_error(name, seconds, "a finite number of seconds > 0")
        if self.isolation not in ("thread", "process", "ray"):
            raise config_error(
                "isolation",
                self.isolation,
                "'thread', 'process' or 'ray'",
                "use 'process' to train in a child process a service's event loop never waits on, "
                "'ray' to train on a Ray cluster (the config's ray section).",
            )
        self._check_smoke_run()

    def _check_smoke_run(self) -> None:
        smoke = self.fast_dev_run
        if not (isinstance(smoke, bool) or (is_int(smoke) and smoke >= 1)):
            raise config_error(
                "fast_dev_run",
                smoke,
                "False, True (1 batch) or an integer >= 1 (that many)",
                "pass fast_dev_run=True for one train and one val batch, False to train.",
            )
        for name in ("limit_train_batches", "limit_val_batches"):
            limit = getattr(self, name)
            if limit is None or (is_int(limit) and limit >= 1):
                continue
            if isinstance(limit, float) and 0.0 < limit <= 1.0:
                continue
            fix = f"{name}=10 for 10 batches, {name}=0.25 for a quarter, None for all."
            if isinstance(limit, float) and limit > 1.0 and limit.is_integer():
                fix = f"an int counts batches: {name}={int(limit)}."
            elif name == "limit_val_batches" and limit in (0, 0.0) and not isinstance(limit, bool):
                fix = "to skip validation, pass val_every_n_epochs=None (or no val_loader)."
            raise config_error(
                name,
                limit,
                "None (all batches), an integer >= 1 (that many batches) or a "
                "float in (0, 1] (that fraction of the loader)",
                fix,
            )

    @property
    def keeps_files(self) -> bool:
        """Whether the run's directory is kept under ``log_dir``: False for a ``fast_dev_run``
        without ``keep_fast_dev_run_files`` (its files live in a temporary folder)."""
        return self.fast_dev_run is False or self.keep_fast_dev_run_files

    @property
    def smoke_batches(self) -> int | None:
        """The batches per loader of a ``fast_dev_run`` (None: not one)."""
        smoke = self.fast_dev_run
        return None if smoke is False else 1 if smoke is True else int(smoke)

    def for_run(self) -> RunConfig:
        """This section as a run uses it: itself, or, for a ``fast_dev_run`` of ``n``
        batches, one epoch of ``n`` train and ``n`` val batches, validated at its end (the
        same section again when applied twice)."""
        batches = self.smoke_batches
        if batches is None:
            return self
        run = replace(
            self,
            max_epochs=1,
            max_steps=None,
            limit_train_batches=batches,
            limit_val_batches=batches,
            val_every_n_epochs=1,
            val_every_n_steps=None,
            num_sanity_val_steps=0,  # its one validation comes after one step anyway
        )
        return self if run == self else run
