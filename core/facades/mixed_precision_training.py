"""The facade of mixed precision (seeds 000 and 002): the names their users import from here.

The facade class extends :class:`~core.precision.policy.PrecisionPolicy`; its per-batch calls
are ``core.facades.eager``'s, each reading its values back before it returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from core.config import OptimConfig
from core.errors import config_error
from core.facades.eager.emit import emit_to
from core.facades.eager.epochs import EagerEpochs
from core.facades.eager.manual import ManualSteps
from core.facades.eager.steps import EagerSteps
from core.hardware.device import device_of
from core.loop.objective import LossFn
from core.loop.recorder import Scheduler
from core.precision import policy
from core.precision.compatibility import check_amp_compatibility
from core.precision.config import AmpDtype, LossScalerConfig, MixedPrecisionConfig

__all__ = (
    "LossScalerConfig",
    "MixedPrecisionConfig",
    "MixedPrecisionOptimizer",
    "MixedPrecisionTrainer",
    "check_amp_compatibility",
    "create_mixed_precision_optimizer",
    "create_mixed_precision_trainer",
)


def _model_device(model: nn.Module | None) -> torch.device:
    first = None if model is None else next(model.parameters(), None)
    return torch.device("cpu") if first is None else first.device


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


class MixedPrecisionTrainer(policy.PrecisionPolicy):
    """:class:`~core.precision.policy.PrecisionPolicy` with seed 002's per-batch steps and
    seed 000's four calls.

    The device defaults to the model's (else the CPU; a trainer made without either moves to
    the model's device at its first call). ``logger`` (``logging`` or structlog) receives the
    step records.

    Example::

        trainer = MixedPrecisionTrainer(MixedPrecisionConfig(dtype="bf16"))
        predictions = trainer.forward_pass(model, inputs)
        loss = trainer.compute_loss(nn.CrossEntropyLoss(), predictions, targets)
        trainer.backward_pass(loss, optimizer)
        trainer.optimizer_step(optimizer)
    """

    def __init__(
        self,
        config: MixedPrecisionConfig | None = None,
        device: torch.device | str | None = None,
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        logger: Any | None = None,
        loss_fn: LossFn | None = None,
        scheduler: Scheduler | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        self._device_given = device is not None
        place = torch.device(device) if device is not None else _model_device(model)
        super().__init__(config or MixedPrecisionConfig(), place)
        self.model, self.optimizer, self.logger = model, optimizer, logger
        self.loss_fn, self.scheduler = loss_fn, scheduler
        self.optim = OptimConfig(max_grad_norm=max_grad_norm)  # the clip, validated here
        self._emit = emit_to(logger)
        self._steps: EagerSteps | None = None
        self._calls: ManualSteps | None = None
        self._announce(model)

    def _announce(self, model: nn.Module | None) -> None:
        if self.config.track_memory_usage:
            self.note_memory_savings(None, "not measured yet: measured at the first train_step")
        if model is not None and self.config.check_compatibility:
            self.compatibility = check_amp_compatibility(
                model,
                device=self.device,
                dtype=self.amp_precision.dtype,
                loss_scaling=self.config.enable_grad_scaler,
            )
            self._emit("amp_compatibility", **self.compatibility)

    def _bind(self, model: nn.Module | None, device: torch.device | str | None) -> None:
        """Follow the model's device before the first step (if no device was given)."""
        target = _model_device(model) if model is not None else torch.device(device or "cpu")
        if device is not None and not _same_device(torch.device(device), target):
            raise config_error(
                "device",
                str(device),
                f"the model's device ({target})",
                "move the model first: model.to(device), then create the optimizer.",
            )
        if _same_device(target, self.device):
            return
        if self._device_given or self._total_steps or self._steps or self._calls:
            raise config_error(
                "device",
                str(target),
                f"{self.device} (this trainer's device)",
                "move the model to the trainer's device, or create the trainer with "
                "device=... matching the model.",
            )
        wanted = self._amp_wanted  # an enable/disable made before the first call stays
        super().__init__(self.config, target)  # nothing has run yet: resolve there instead
        self._amp_wanted = wanted
        self._announce(model)

    def _engine(self, device: torch.device | str | None) -> EagerSteps:
        if self._steps is None:
            if self.model is None or self.optimizer is None:
                missing = "model" if self.model is None else "optimizer"
                raise config_error(
                    missing,
                    None,
                    f"an {'nn.Module' if missing == 'model' else 'optimizer'}",
                    f"pass MixedPrecisionTrainer(config, {missing}={missing}) (or use "
                    "create_mixed_precision_trainer(model, optimizer)) before train_step().",
                )
            self._bind(self.model, device)
            self._steps = EagerSteps(
                model=self.model,
                optimizer=self.optimizer,
                policy=self,
                emit=self._emit,
                loss_fn=self.loss_fn,
                scheduler=self.scheduler,
                optim=self.optim,
                track_memory=self.config.track_memory_usage,
            )
        elif device is not None:
            self._bind(self.model, device)
        return self._steps

    def _manual(self, model: nn.Module | None = None) -> ManualSteps:
        if self._calls is None:
            if model is not None:
                self._bind(model, None)
            if self.config.track_memory_usage:
                self.note_memory_savings(
                    None,
                    "not measured: the four-call form never sees a whole batch; "
                    "train_step and runs measure it",
                )
            self._calls = ManualSteps(self, emit=self._emit, optim=self.optim)
        return self._calls

    # -- seed 002: one call, one optimizer step --------------------------------------------
    def train_step(
        self, batch: Any, loss_fn: LossFn | None = None, device: torch.device | str | None = None
    ) -> dict[str, Any]:
        """One optimizer step on ``batch`` (see :meth:`EagerSteps.train_step`)."""
        return self._engine(device).train_step(batch, loss_fn)

    def validate_step(
        self, batch: Any, loss_fn: LossFn | None = None, device: torch.device | str | None = None
    ) -> dict[str, Any]:
        """``loss`` and ``accuracy`` of ``batch`` under no_grad and autocast."""
        return self._engine(device).validate_step(batch, loss_fn)

    # -- seed 000: four calls, one optimizer step ------------------------------------------
    def forward_pass(self, model: nn.Module, data: Any) -> Any:
        """``model(data)`` under the step's autocast (opens the step)."""
        return self._manual(model).forward_pass(model, data)

    def compute_loss(self, criterion: Any, predictions: Any, targets: Any) -> torch.Tensor:
        """``criterion(predictions, targets)`` under autocast."""
        return self._manual().compute_loss(criterion, predictions, targets)

    def backward_pass(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Backward of ``loss``, scaled for fp16."""
        self._manual().backward_pass(loss, optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Unscale, skip on overflow, step, update the scale, zero the gradients."""
        return self._manual().optimizer_step(optimizer)

    def cleanup(self) -> None:
        """Drop the per-batch engines and return cached CUDA memory (no-op on CPU)."""
        self._steps = self._calls = None
        device_of(self.device).empty_cache()


def create_mixed_precision_trainer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    enable_amp: bool = True,
    dtype: AmpDtype = "auto",
    enable_grad_scaler: bool = True,
    *,
    device: torch.device | str | None = None,
    logger: Any | None = None,
    loss_fn: LossFn | None = None,
    max_grad_norm: float | None = None,
    **config_fields: Any,
) -> MixedPrecisionTrainer:
    """A :class:`MixedPrecisionTrainer` for ``model`` and ``optimizer``; ``config_fields``
    are further :class:`MixedPrecisionConfig` fields (seed names included).

    Example::

        trainer = create_mixed_precision_trainer(model, optimizer, dtype=torch.float16)
    """
    config = MixedPrecisionConfig(
        enable_amp=enable_amp, dtype=dtype, enable_grad_scaler=enable_grad_scaler, **config_fields
    )
    return MixedPrecisionTrainer(
        config,
        device,
        model=model,
        optimizer=optimizer,
        logger=logger,
        loss_fn=loss_fn,
        max_grad_norm=max_grad_norm,
    )


class MixedPrecisionOptimizer:
    """Seed 002's epoch-level wrapper: whole epochs of :meth:`MixedPrecisionTrainer.train_step`.

    Example::

        mp = MixedPrecisionOptimizer(model, optimizer, MixedPrecisionConfig(dtype="bf16"))
        mp.train_epoch(train_loader)["loss"], mp.validate_epoch(val_loader)["accuracy"]
        mp.get_training_stats()["amp"]["amp_usage_ratio"]
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: MixedPrecisionConfig | None = None,
        loss_fn: LossFn | None = None,
        device: torch.device | str | None = None,
        *,
        scheduler: Scheduler | None = None,
        max_grad_norm: float | None = None,
        logger: Any | None = None,
    ) -> None:
        self.trainer = MixedPrecisionTrainer(
            config,
            device,
            model=model,
            optimizer=optimizer,
            logger=logger,
            loss_fn=loss_fn,
            scheduler=scheduler,
            max_grad_norm=max_grad_norm,
        )
        self.config = self.trainer.config
        self._epochs: EagerEpochs | None = None

    @property
    def epochs(self) -> EagerEpochs:
        if self._epochs is None:
            self._epochs = EagerEpochs(
                self.trainer._engine(None),
                clear_cache=self.config.clear_cache,
                log_amp_stats=self.config.log_amp_stats,
            )
        return self._epochs

    def train_epoch(self, loader: Iterable[Any]) -> dict[str, Any]:
        """See :meth:`EagerEpochs.train_epoch`."""
        return self.epochs.train_epoch(loader)

    def validate_epoch(self, loader: Iterable[Any]) -> dict[str, Any]:
        """See :meth:`EagerEpochs.validate_epoch`."""
        return self.epochs.validate_epoch(loader)

    def get_training_stats(self) -> dict[str, Any]:
        """Each epoch's and validation's results, and the AMP statistics."""
        return self.epochs.training_stats()

    def get_amp_stats(self) -> dict[str, Any]:
        return self.trainer.get_amp_stats()

    def cleanup(self) -> None:
        """Release the per-batch engine and cached CUDA memory."""
        self._epochs = None
        self.trainer.cleanup()


def create_mixed_precision_optimizer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    loss_fn: LossFn | None = None,
    device: torch.device | str | None = None,
    logger: Any | None = None,
    **config_fields: Any,
) -> MixedPrecisionOptimizer:
    """A :class:`MixedPrecisionOptimizer`; ``config_fields`` are
    :class:`MixedPrecisionConfig` fields (``dtype="bf16"``, ``init_scale=2**12``...).

    Example::

        mp = create_mixed_precision_optimizer(model, optimizer, dtype="bf16")
    """
    config = MixedPrecisionConfig(**config_fields)
    return MixedPrecisionOptimizer(model, optimizer, config, loss_fn, device, logger=logger)
