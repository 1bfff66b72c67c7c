"""``devices=N``: whether this process starts the job's N ranks, checked against the machine."""

from __future__ import annotations

import torch

from core.distributed.config import MultiGPUConfig
from core.distributed.environment import DistributedEnvironment
from core.errors import config_error

__all__ = ("FIELD", "ranks_to_start")

FIELD = "distributed.devices"  # devices= is its flat keyword


def ranks_to_start(config: MultiGPUConfig, *, isolation: str = "thread") -> int | None:
    """How many ranks this process must start for ``config`` (None: it trains itself);
    ``isolation="process"`` is refused with devices > 1."""
    devices = config.devices
    if devices is None:
        return None
    env = DistributedEnvironment.from_environ()
    if env is not None:
        if devices != env.local_world_size:
            raise config_error(
                FIELD,
                devices,
                f"{env.local_world_size} (this torchrun's --nproc-per-node) or None under torchrun",
                "leave devices out under torchrun (it started the "
                "ranks already), or run the script with python and devices=N instead.",
            )
        return None
    if devices == 1 or isolation == "ray":  # ray: the run's actor starts its ranks
        return None
    if isolation == "process":
        raise config_error(
            FIELD,
            devices,
            "None or 1 with run.isolation='process'",
            f"drop isolation='process': with devices={devices} the ranks already train in "
            "processes of their own, supervised the same way.",
        )
    _check_machine(config, devices)
    return devices


def _check_machine(config: MultiGPUConfig, devices: int) -> None:
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda and config.training_mode != "cpu":  # 'cpu': the ranks leave the GPUs alone
        usable = len(config.device_ids) if config.device_ids is not None else cuda
        named = "of device_ids" if config.device_ids is not None else "of this machine"
        if devices > usable:
            raise config_error(
                FIELD,
                devices,
                f"at most {usable}, the CUDA devices {named} (one per rank)",
                f"devices={usable} or fewer; more ranks than GPUs need several machines "
                "(torchrun --nnodes on each).",
            )
    elif config.backend == "nccl":
        raise config_error(
            "distributed.backend",
            "nccl",
            f"'gloo' or None for devices={devices} on a machine without CUDA",
            "backend=None (gloo on CPU).",
        )
