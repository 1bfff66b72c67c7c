"""``MultiGPUConfig``: where and how a job is distributed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from core.checks import check_bool_fields, is_finite_number, is_int
from core.distributed.expert_parallel import TokenExchangeChoice
from core.distributed.fsdp import ShardPolicy
from core.errors import config_error
from core.flat_keyword import flat

__all__ = ("MODES", "MultiGPUConfig", "TOKEN_EXCHANGES", "TrainingMode")

TOKEN_EXCHANGES: tuple[str, ...] = get_args(TokenExchangeChoice)

TrainingMode = Literal[
    "auto", "cpu", "single_gpu", "data_parallel", "distributed", "fsdp", "expert_parallel"
]
MODES: tuple[str, ...] = get_args(TrainingMode)
_ONE_PROCESS = ("cpu", "single_gpu", "data_parallel")
_RANKED = tuple(mode for mode in MODES if mode not in _ONE_PROCESS)


def _nonnegative_or_unset(value: object) -> bool:
    return is_int(value) and value >= -1


@dataclass(frozen=True, kw_only=True)
class MultiGPUConfig:
    """How the job is distributed. ``world_size``/``rank``/``local_rank`` of -1 come from
    torchrun's environment; ``backend=None`` means NCCL with CUDA, gloo without.
    ``stop_vote_interval``: ranks agree on stopping (cancellation, signals) every that many
    step boundaries.
    ``enable_gpu_monitoring=False`` turns the run's monitor off, as ``monitor.enabled=False``
    does.
    ``training_mode="expert_parallel"`` (a model with ``core.moe.MoELayer`` blocks): under
    torchrun experts are sharded over the ranks and tokens exchanged by all-to-all
    (``expert_token_exchange``: "auto", "all_to_all" or "all_gather"); in one process the
    experts are placed on this machine's GPUs by a cost model.

    ``devices=N`` starts N ranks on this machine (one GPU each with CUDA, gloo ranks on CPU;
    ``training_mode="cpu"``: gloo ranks on the CPU, GPUs or not) with torch's own elastic
    launcher, as ``torchrun --standalone --nproc-per-node N`` would,
    no torchrun command needed. None (the default) or 1: this process is the job, or one of
    the ranks torchrun started. Several machines still take ``torchrun --nnodes``."""

    training_mode: TrainingMode = field(default="auto", metadata=flat("training_mode"))
    enable_data_parallel: bool = True
    device_ids: Sequence[int] | None = None
    enable_distributed: bool = True
    backend: Literal["nccl", "gloo"] | None = None
    init_method: str = "env://"
    world_size: int = -1
    rank: int = -1
    local_rank: int = -1
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    bucket_cap_mb: float = 25.0
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    enable_gpu_monitoring: bool = True
    sync_bn: bool = False
    timeout_s: float = 1800.0
    # A 4-byte gloo all-reduce costs ~50 us alone, ~200 us between two local processes: voting
    # every 16 boundaries keeps it near 1% of a small CPU step, and a stop lands within 32 steps.
    stop_vote_interval: int = 16
    fsdp_shard_policy: ShardPolicy | None = None
    fsdp_mixed_precision: bool = False
    fsdp_reshard_after_forward: bool = True
    expert_token_exchange: TokenExchangeChoice = "auto"
    devices: int | None = field(default=None, metadata=flat("devices"))

    def __post_init__(self) -> None:
        check_bool_fields(self)
        if self.training_mode not in MODES:
            raise config_error("training_mode", self.training_mode, MODES)
        if self.expert_token_exchange not in TOKEN_EXCHANGES:
            raise config_error("expert_token_exchange", self.expert_token_exchange, TOKEN_EXCHANGES)
        if self.backend not in (None, "nccl", "gloo"):
            raise config_error("backend", self.backend, (None, "nccl", "gloo"))
        ids = self.device_ids
        if ids is not None and not (
            isinstance(ids, Sequence)  # a str fails below: its items are not ints
            and len(ids) > 0
            and all(is_int(i) and i >= 0 for i in ids)
            and len(set(ids)) == len(ids)
        ):
            raise config_error("device_ids", ids, "None or distinct CUDA device indices >= 0")
        for name in ("world_size", "rank", "local_rank"):
            if not _nonnegative_or_unset(getattr(self, name)):
                raise config_error(
                    name, getattr(self, name), "-1 (from torchrun) or an integer >= 0"
                )
        if self.world_size == 0 or (self.world_size > 0 and self.rank >= self.world_size):
            raise config_error("rank", self.rank, f"0 <= rank < world_size={self.world_size}")
        if not (is_finite_number(self.timeout_s) and self.timeout_s > 0):
            raise config_error("timeout_s", self.timeout_s, "a finite number of seconds > 0")
        if not (is_int(self.stop_vote_interval) and self.stop_vote_interval >= 1):
            raise config_error("stop_vote_interval", self.stop_vote_interval, "an integer >= 1")
        if not (is_finite_number(self.bucket_cap_mb) and self.bucket_cap_mb > 0):
            raise config_error("bucket_cap_mb", self.bucket_cap_mb, "a finite number of MB > 0")
        if not isinstance(self.init_method, str):
            raise config_error("init_method", self.init_method, "a URL string such as 'env://'")
        self._check_devices()

    def _check_devices(self) -> None:
        devices = self.devices
        if devices is None:
            return
        if not (is_int(devices) and devices >= 1):
            raise config_error(
                "devices",
                devices,
                "None or an integer >= 1 (the processes to start on this machine)",
                "devices=2; for several machines run `torchrun --nnodes M "
                "--nproc-per-node N` on each (devices= starts ranks on this machine only).",
            )
        if devices == 1:
            return
        if self.training_mode in _ONE_PROCESS and self.training_mode != "cpu":
            raise config_error(
                "training_mode",
                self.training_mode,
                f"'cpu', {', '.join(map(repr, _RANKED))} with devices={devices}",
                f"training_mode='auto' (DDP over the {devices} ranks), "
                "or devices=None to train in one process.",
            )
        if self.training_mode == "cpu" and self.backend == "nccl":
            raise config_error(
                "backend",
                "nccl",
                f"'gloo' or None with training_mode='cpu' and devices={devices} (CPU ranks)",
                "backend=None, or training_mode='auto' for one GPU per rank.",
            )
        if not self.enable_distributed:
            raise config_error(
                "enable_distributed",
                False,
                f"True with devices={devices}",
                "enable_distributed=True, or devices=None to train in one process.",
            )
        for name in ("world_size", "rank", "local_rank"):
            if getattr(self, name) != -1:
                raise config_error(
                    name,
                    getattr(self, name),
                    f"-1 with devices={devices} (the launcher gives each rank its own)",
                    f"leave {name} out, or devices=None.",
                )
