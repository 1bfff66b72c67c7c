"""Choosing and building the strategy a ``MultiGPUConfig`` asks for on this machine. The one
place that branches on the mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.distributed.base import Strategy
from core.distributed.config import MultiGPUConfig
from core.distributed.data_parallel import DataParallelStrategy
from core.distributed.ddp import DDPStrategy
from core.distributed.environment import DistributedEnvironment, rendezvous_address
from core.distributed.expert_parallel import ExpertParallelStrategy
from core.distributed.expert_placement import ExpertPlacementStrategy
from core.distributed.fsdp import FSDPStrategy
from core.errors import ConfigError, config_error
from core.hardware.device import device_of
from core.moe.placement import DeviceDescription, describe_cuda_devices

__all__ = ("Machine", "StrategyOptions", "build_strategy", "resolve_mode")


@dataclass(frozen=True)
class Machine:
    """What mode resolution looks at: the torchrun environment and the CUDA devices."""

    env: DistributedEnvironment | None
    cuda_count: int
    master: tuple[str | None, str | None] = (None, None)
    devices: tuple[DeviceDescription, ...] | None = None

    @classmethod
    def detect(cls) -> Machine:
        cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(DistributedEnvironment.from_environ(), cuda, rendezvous_address())


def resolve_mode(config: MultiGPUConfig, machine: Machine) -> tuple[str, list[str]]:
    """The concrete mode for ``config`` on ``machine``, and notes on why."""
    if config.training_mode == "cpu" and config.devices is not None and config.devices > 1:
        return "distributed", [f"training_mode='cpu', devices={config.devices}: DDP on the CPU"]
    if config.training_mode != "auto":
        return config.training_mode, []
    if machine.env is not None:
        if not config.enable_distributed:
            raise ConfigError(
                "this process runs under torchrun (RANK is set) but enable_distributed=False; "
                "each process would train alone. Fix: enable_distributed=True, or run the "
                "script with python instead of torchrun."
            )
        return "distributed", ["torchrun environment found: DistributedDataParallel"]
    if machine.cuda_count == 0:
        return "cpu", ["no CUDA device: training on CPU"]
    if machine.cuda_count == 1:
        return "single_gpu", ["one CUDA device"]
    if config.enable_data_parallel:
        return "data_parallel", [
            f"{machine.cuda_count} GPUs without torchrun: DataParallel; DDP is faster: "
            f"torchrun --standalone --nproc_per_node={machine.cuda_count} your_script.py"
        ]
    return "single_gpu", [
        f"{machine.cuda_count} GPUs found, training on one (enable_data_parallel=False). To use "
        f"all of them: torchrun --standalone --nproc_per_node={machine.cuda_count} your_script.py"
    ]


@dataclass(frozen=True)
class StrategyOptions:
    use_distributed_sampler: bool
    seed: int


def _require_cuda(mode: str, machine: Machine) -> None:
    if machine.cuda_count == 0:
        raise ConfigError(
            f"training_mode={mode!r} needs a CUDA GPU and this machine has none; allowed here: "
            "'auto' or 'cpu' (or 'distributed' with backend='gloo'). Fix: training_mode='auto'."
        )


def _check_ids(ids: Sequence[int], machine: Machine) -> list[int]:
    missing = [i for i in ids if i >= machine.cuda_count]
    if missing:
        raise config_error(
            "device_ids",
            list(ids),
            f"indices below the {machine.cuda_count} CUDA devices of this machine",
            f"remove {missing}.",
        )
    return list(ids)


def _cpu(config: MultiGPUConfig, machine: Machine, options: StrategyOptions) -> Strategy:
    return Strategy(torch.device("cpu"), "cpu")


def _single_gpu(config: MultiGPUConfig, machine: Machine, options: StrategyOptions) -> Strategy:
    _require_cuda("single_gpu", machine)
    (index,) = _check_ids(config.device_ids[:1] if config.device_ids else [0], machine)
    return Strategy(torch.device("cuda", index), "single_gpu")


def _data_parallel(config: MultiGPUConfig, machine: Machine, options: StrategyOptions) -> Strategy:
    _require_cuda("data_parallel", machine)
    ids = config.device_ids if config.device_ids is not None else range(machine.cuda_count)
    return DataParallelStrategy(_check_ids(list(ids), machine))


def _group(
    config: MultiGPUConfig, machine: Machine, options: StrategyOptions, mode: str
) -> dict[str, Any]:
    env = machine.env
    world_size = config.world_size if config.world_size >= 0 else (env.world_size if env else -1)
    rank = config.rank if config.rank >= 0 else (env.rank if env else -1)
    if world_size < 1 or rank < 0:
        raise ConfigError(
            f"training_mode={mode!r} needs a world size and a rank, and this process is not "
            "under torchrun. Fix: launch with `torchrun --standalone --nproc_per_node=N "
            "script.py`, or set MultiGPUConfig(world_size=..., rank=...) with MASTER_ADDR "
            "and MASTER_PORT in the environment."
        )
    if config.init_method == "env://" and env is None and None in machine.master:
        raise ConfigError(
            "init_method='env://' needs MASTER_ADDR and MASTER_PORT in the environment. Fix: "
            "set them (see core.facades.multi_gpu_training.setup_distributed_environment) or pass "
            "init_method='tcp://HOST:PORT'."
        )
    local_rank = config.local_rank if config.local_rank >= 0 else (env.local_rank if env else rank)
    # training_mode='cpu' with devices=N: gloo ranks on the CPU, on a CUDA machine too.
    cuda_count = 0 if config.training_mode == "cpu" else machine.cuda_count
    backend = config.backend or ("nccl" if cuda_count else "gloo")
    if backend == "nccl" and cuda_count == 0:
        raise config_error(
            "backend", "nccl", "'gloo' on a machine without CUDA", "pass backend='gloo' or None."
        )
    if cuda_count:
        ids = config.device_ids if config.device_ids is not None else range(machine.cuda_count)
        ids = _check_ids(list(ids), machine)
        if local_rank >= len(ids):
            raise ConfigError(
                f"local_rank={local_rank} has no GPU: this node has {len(ids)} usable. Fix: "
                f"--nproc_per_node={len(ids)} or fewer."
            )
        device = torch.device("cuda", ids[local_rank])
    else:
        device = torch.device("cpu")
    if config.sync_bn and not device_of(device).is_cuda:
        raise config_error(
            "sync_bn",
            True,
            "False on CPU (torch's SyncBatchNorm runs on CUDA devices only)",
            "set sync_bn=False; BatchNorm statistics then stay per rank.",
        )
    return {
        "device": device,
        "backend": backend,
        "init_method": config.init_method,
        "world_size": world_size,
        "rank": rank,
        "local_rank": local_rank,
        "timeout_s": config.timeout_s,
        "sync_bn": config.sync_bn,
        "use_distributed_sampler": options.use_distributed_sampler,
        "seed": options.seed,
        "vote_interval": config.stop_vote_interval,
        "agent_rendezvous": env.agent_rendezvous() if env is not None else None,
    }


def _ddp(config: MultiGPUConfig, machine: Machine, options: StrategyOptions) -> Strategy:
    return DDPStrategy(
        find_unused_parameters=config.find_unused_parameters,
        broadcast_buffers=config.broadcast_buffers,
        bucket_cap_mb=config.bucket_cap_mb,
        static_graph=config.static_graph,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        **_group(config, machine, options, "distributed"),
    )


def _fsdp(config: MultiGPUConfig, machine: Machine, options: StrategyOptions) -> Strategy:
    return FSDPStrategy(
        shard_policy=config.fsdp_shard_policy,
        mixed_precision=config.fsdp_mixed_precision,
        reshard_after_forward=config.fsdp_reshard_after_forward,
        **_group(config, machine, options, "fsdp"),
    )


def _expert_parallel(
    config: MultiGPUConfig, machine: Machine, options: StrategyOptions
) -> Strategy:
    if machine.env is not None or config.world_size >= 1:  # ranks: experts sharded over them
        return ExpertParallelStrategy(
            token_exchange=config.expert_token_exchange,
            find_unused_parameters=config.find_unused_parameters,
            broadcast_buffers=config.broadcast_buffers,
            bucket_cap_mb=config.bucket_cap_mb,
            **_group(config, machine, options, "expert_parallel"),
        )
    described = machine.devices if machine.devices is not None else describe_cuda_devices()
    ids = config.device_ids if config.device_ids is not None else range(machine.cuda_count)
    usable = {f"cuda:{i}" for i in _check_ids(list(ids), machine)}
    devices = [d for d in described if d.device in usable or not machine.cuda_count]
    primary = (
        torch.device(devices[0].device) if machine.cuda_count and devices else torch.device("cpu")
    )
    return ExpertPlacementStrategy(
        primary, devices, move=machine.cuda_count > 1 and len(devices) > 1
    )


_BUILDERS: dict[str, Callable[[MultiGPUConfig, Machine, StrategyOptions], Strategy]] = {
    "cpu": _cpu,
    "single_gpu": _single_gpu,
    "data_parallel": _data_parallel,
    "distributed": _ddp,
    "fsdp": _fsdp,
    "expert_parallel": _expert_parallel,
}


def build_strategy(
    mode: str, config: MultiGPUConfig, machine: Machine, options: StrategyOptions
) -> Strategy:
    """The strategy object for a resolved ``mode`` (validated against ``machine``)."""
    return _BUILDERS[mode](config, machine, options)
