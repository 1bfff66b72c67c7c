"""Seed 000's ``GPUConfig`` and how its fields map onto the config tree.
:func:`training_config` writes them there:

==================================  =====================================================
``GPUConfig`` field                 where it goes
==================================  =====================================================
``device_ids``                      ``distributed.device_ids``
``memory_fraction``                 ``hardware.memory_fraction`` (None: no cap)
``enable_mixed_precision``          ``precision.enable_amp`` (AMP runs when this and
                                    ``MixedPrecisionConfig.enable_amp`` are both on)
``enable_gradient_checkpointing``   ``transforms.activation_checkpointing=True`` for a model
                                    with repeated blocks; a model without any trains as it is
``enable_data_parallel``            ``distributed.enable_data_parallel``
``enable_distributed``              ``distributed.enable_distributed``
``pin_memory``, ``num_workers``,    ``data.loader`` (a :class:`~core.data.LoaderConfig`):
``prefetch_factor``,                used by the loaders core builds
``persistent_workers``              (``IntegratedGPUTrainingSystem.create_dataloader``)
==================================  =====================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from core.checks import check_bool_fields
from core.config import TrainingConfig
from core.data.config import LoaderConfig
from core.distributed.config import MultiGPUConfig
from core.hardware.settings import GPUManagerConfig
from core.precision.config import MixedPrecisionConfig

__all__ = ("GPUConfig", "training_config")


@dataclass(frozen=True, kw_only=True)
class GPUConfig:
    """Seed 000's device settings; the module docstring maps each field onto the tree.

    ``device_ids``: the CUDA devices (None: every visible one; the first trains without
    DataParallel). ``enable_data_parallel``: DataParallel over several GPUs without torchrun.
    ``num_workers=-1``: chosen from the CPU cores.

    Example::

        GPUConfig(device_ids=[0], memory_fraction=0.9, num_workers=4)
    """

    device_ids: Sequence[int] | None = None
    memory_fraction: float | None = None
    enable_mixed_precision: bool = True
    enable_gradient_checkpointing: bool = False
    enable_data_parallel: bool = False
    enable_distributed: bool = True
    pin_memory: bool = True
    num_workers: int = -1
    prefetch_factor: int | None = None
    persistent_workers: bool = True

    def __post_init__(self) -> None:
        check_bool_fields(self)
        # Each field is checked by the section it maps to: its error names the same field.
        self.manager_config()
        self.loader_config()
        MultiGPUConfig(device_ids=self.device_ids)

    def manager_config(self) -> GPUManagerConfig:
        """The ``hardware`` section: the memory cap, TF32 on."""
        return GPUManagerConfig(memory_fraction=self.memory_fraction)

    def loader_config(self, base: LoaderConfig | None = None) -> LoaderConfig:
        """``data.loader`` with this config's four loader fields."""
        return dataclasses.replace(
            base or LoaderConfig(),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
            prefetch_factor=self.prefetch_factor,
        )


def training_config(
    gpu_config: GPUConfig,
    mixed_precision_config: MixedPrecisionConfig | None,
    base: TrainingConfig,
    *,
    checkpoint_blocks: bool,
) -> TrainingConfig:
    """``base`` with ``gpu_config``'s fields and ``mixed_precision_config`` (the whole
    precision section) written; ``checkpoint_blocks``: the model has repeated blocks."""
    precision = mixed_precision_config or base.precision
    amp = precision.enable_amp and gpu_config.enable_mixed_precision
    tree = dataclasses.replace(
        base,
        precision=dataclasses.replace(precision, enable_amp=amp),
        data=dataclasses.replace(base.data, loader=gpu_config.loader_config(base.data.loader)),
    )
    values: dict[str, object] = {
        "hardware.memory_fraction": gpu_config.memory_fraction,
        "distributed.device_ids": gpu_config.device_ids,
        "distributed.enable_data_parallel": gpu_config.enable_data_parallel,
        "distributed.enable_distributed": gpu_config.enable_distributed,
    }
    named = base.transforms.activation_checkpointing is not False  # block classes win
    if gpu_config.enable_gradient_checkpointing and checkpoint_blocks and not named:
        values["transforms.activation_checkpointing"] = True
    return tree.replace(values)
