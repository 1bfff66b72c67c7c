"""Founding document 004's ``PerformanceOptimizer``, the performance system its multi-GPU
trainer "works with": the hardware detected, and what core applies on it to a model
(document 000's ``GPUManager``) and to its loaders (document 001's parallel loading), in one
object that decides nothing a run would not.

Example::

    performance = PerformanceOptimizer()
    model = performance.optimize_model(model)
    train_loader = performance.optimize_dataloader(train_loader)
    performance.get_optimization_summary()["loaders"]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from core.data.config import LoaderConfig
from core.data.loader import auto_num_workers, usable_cores
from core.data.rebuild import rebuild_loader
from core.facades.integrated.config import GPUConfig
from core.facades.integrated.manager import GPUManager
from core.precision.config import MixedPrecisionConfig
from core.precision.policy import resolve_precision

__all__ = ("PerformanceOptimizer",)


class PerformanceOptimizer:
    """The device's settings and reports (``gpu_config``: a :class:`GPUConfig`, whose loader
    fields are the loaders' unless ``loader`` is given), and the optimisations a run applies
    on it, for code that builds its own loop.

    ``optimize_model`` applies the device settings (TF32, cuDNN benchmark, the memory cap),
    moves the model there and makes a conv net channels_last on CUDA; ``optimize_dataloader``
    gives a DataLoader left at ``num_workers=0`` workers, prefetch and pinned memory on CUDA
    where that is safe (:func:`core.data.rebuild.rebuild_loader`); neither compiles (a run's
    ``compile="auto"`` times its own steps to decide).
    """

    def __init__(
        self,
        gpu_config: GPUConfig | None = None,
        device: torch.device | str | None = None,
        *,
        loader: LoaderConfig | None = None,
    ) -> None:
        self.manager = GPUManager(gpu_config, device)
        self.loader_config = loader or self.manager.gpu_config.loader_config()
        self.loaders: list[dict[str, Any]] = []
        """What each :meth:`optimize_dataloader` call applied, or why not, in call order."""

    @property
    def device(self) -> torch.device:
        return self.manager.device

    def detect_hardware(self) -> dict[str, Any]:
        """The device (:meth:`GPUManager.get_gpu_info`; the host's without CUDA), the precision
        ``dtype="auto"`` picks on it, the usable CPU cores and the loader workers they give."""
        auto = resolve_precision(MixedPrecisionConfig(), self.device)
        return self.manager.get_gpu_info() | {
            "device": str(self.device),
            "auto_precision": auto.name,
            "usable_cores": usable_cores(),
            "auto_num_workers": auto_num_workers(self.device),
        }

    def optimize_model(self, model: nn.Module) -> nn.Module:
        """``model``, in place, made ready for the device
        (:meth:`GPUManager.optimize_model_for_gpu`)."""
        return self.manager.optimize_model_for_gpu(model)

    def optimize_dataloader(self, loader: Iterable[Any], *, world_size: int = 1) -> Iterable[Any]:
        """``loader`` rebuilt with the loader settings where safe, else as given; what was
        applied is appended to :attr:`loaders`. ``world_size``: processes sharing the cores."""
        rebuilt, applied = rebuild_loader(
            loader, self.loader_config, device=self.device, world_size=world_size
        )
        self.loaders.append(applied)
        return rebuilt

    def get_optimization_summary(self) -> dict[str, Any]:
        """The hardware detected, what was done to the model (None before
        :meth:`optimize_model`) and to each loader."""
        return {
            "hardware": self.detect_hardware(),
            "model": self.manager.last_optimization,
            "loaders": list(self.loaders),
        }
