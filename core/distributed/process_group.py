"""What DDP and FSDP2 share: one process per device and a torch.distributed process group.

Only a group created here is destroyed in ``teardown``. With NCCL, control-plane collectives
(stop votes, early stopping, the run id) use a gloo group: the host never waits for the GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import PrefixStore, TCPStore
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from core.distributed.base import Strategy
from core.distributed.lockstep import (
    Lockstep,
    LockstepLoader,
    StreamLockstep,
    batches_in,
    uneven_loaders_error,
)
from core.distributed.outcome import RankOutcome, exchange_outcomes
from core.distributed.samplers import shard_loader
from core.errors import ConfigError

__all__ = ("ProcessGroupStrategy",)

T = TypeVar("T")


class ProcessGroupStrategy(Strategy):
    """Base of the multi-process strategies; subclasses wrap the model."""

    def __init__(
        self,
        device: torch.device,
        name: str,
        *,
        backend: str,
        init_method: str,
        world_size: int,
        rank: int,
        local_rank: int,
        timeout_s: float,
        sync_bn: bool = False,
        use_distributed_sampler: bool = True,
        seed: int = 0,
        vote_interval: int = 16,
        agent_rendezvous: tuple[str, int, str] | None = None,
    ) -> None:
        super().__init__(device, name)
        self.backend = backend
        self.init_method = init_method
        self._world_size = world_size
        self._rank = rank
        self._local_rank = local_rank
        self.timeout_s = timeout_s
        self.sync_bn = sync_bn
        self.use_distributed_sampler = use_distributed_sampler
        self.seed = seed
        self._owns_group = False
        self._control: Any = None
        self._equal_shards = False
        self.vote_interval = vote_interval
        self.stop_vote_interval = vote_interval
        self.agent_rendezvous = agent_rendezvous
        self._boundaries = 0
        self._vote = torch.zeros(1, dtype=torch.int32)
        self._vote_work: Any = None

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"backend": self.backend, "init_method": self.init_method}

    # -- lifecycle ------------------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        if dist.is_initialized():
            if (dist.get_world_size(), dist.get_rank()) != (self._world_size, self._rank):
                raise ConfigError(
                    f"an existing process group has world_size={dist.get_world_size()}, "
                    f"rank={dist.get_rank()}, but this job asks for world_size="
                    f"{self._world_size}, rank={self._rank}. Fix: leave world_size/rank at -1."
                )
        else:
            self._init_group()
            self._owns_group = True
        if dist.get_backend() != "gloo":
            self._control = dist.new_group(
                backend="gloo", timeout=timedelta(seconds=self.timeout_s)
            )

    def _init_group(self) -> None:
        timeout = timedelta(seconds=self.timeout_s)
        size, rank = self._world_size, self._rank
        if self.agent_rendezvous is None or self.init_method != "env://":
            dist.init_process_group(
                self.backend, self.init_method, timeout=timeout, world_size=size, rank=rank
            )
            return
        host, port, prefix = self.agent_rendezvous  # see DistributedEnvironment
        agent = TCPStore(host, port, size, is_master=False, timeout=timeout)
        store = PrefixStore(prefix, agent)
        dist.init_process_group(
            self.backend, timeout=timeout, world_size=size, rank=rank, store=store
        )

    def teardown(self) -> None:
        if self._owns_group and dist.is_initialized():
            self.settle_stop_votes()
            dist.destroy_process_group()
            self._owns_group = False

    # -- model and data -------------------------------------------------------------------
    def _prepare_module(self, model: nn.Module) -> nn.Module:
        if self.sync_bn:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return model.to(self.device)

    def prepare_loader(self, loader: Iterable[Any], *, train: bool) -> Iterable[Any]:
        if self.use_distributed_sampler:
            loader, equal = shard_loader(
                loader, rank=self.rank, world_size=self.world_size, train=train, seed=self.seed
            )
            if train:
                self._equal_shards = equal
        if train:
            return loader  # the step loop checks it at the start of every epoch
        lockstep = self.lockstep(loader, "val_loader")  # once; uneven lengths fail here
        if isinstance(lockstep, StreamLockstep):
            return LockstepLoader(loader, lockstep, "val_loader")
        return loader

    def lockstep(self, loader: Iterable[Any], name: str, *, epoch: int | None = None) -> Lockstep:
        # One all-gather of every rank's length (-1: a stream) decides, the same on all ranks.
        local = batches_in(loader)
        lengths = self._all_gather_int(-1 if local is None else local)
        if min(lengths) < 0:
            return StreamLockstep(self._all_gather_int)
        if len(set(lengths)) > 1:
            raise uneven_loaders_error(name, lengths, epoch)
        return Lockstep()

    def eval_sample_limit(self, loader: Iterable[Any]) -> int | None:
        limit = getattr(getattr(loader, "sampler", None), "real_num_samples", None)
        return limit if isinstance(limit, int) else None

    # -- the step -------------------------------------------------------------------------
    def window_normaliser(
        self, local: float | torch.Tensor, *, exact: bool = False
    ) -> float | torch.Tensor:
        # Gradients are averaged over ranks, so a micro-batch's weight is its share of the
        # global window times world_size. Shards core built hold equal windows on every rank.
        if self._equal_shards and not exact:
            return local if isinstance(local, torch.Tensor) else float(local)
        device = self._collective_device()
        total = (
            local.detach().reshape(1).to(device=device, dtype=torch.float32)
            if isinstance(local, torch.Tensor)
            else torch.tensor([float(local)], device=device)
        )
        dist.all_reduce(total)
        if total.device.type == "cpu":
            return float(total) / self.world_size  # gloo: a CPU tensor, no device sync
        return total.reshape(()) / self.world_size

    def average_gradients(self, grads: Sequence[torch.Tensor]) -> None:
        # One all-reduce per ~25 MB bucket of same-dtype gradients (as DDP buckets them),
        # after backward instead of overlapped with it: the price of agreeing on OOM first.
        device = self._collective_device()
        for bucket in _buckets(grads, _BUCKET_BYTES):
            flat = _flatten_dense_tensors(bucket).to(device)
            dist.all_reduce(flat)
            flat /= self.world_size
            synced = _unflatten_dense_tensors(flat.to(bucket[0].device), bucket)
            for grad, value in zip(bucket, synced, strict=True):
                grad.copy_(value)

    def _collective_device(self) -> torch.device:
        return torch.device("cpu") if dist.get_backend() == "gloo" else self.device

    # -- agreement ------------------------------------------------------------------------
    @property
    def equal_windows(self) -> bool:
        return self._equal_shards

    def should_stop(self, requested: bool) -> bool:
        self._boundaries += 1
        if self._boundaries % self.vote_interval:
            return False
        return self.vote_on_stop(requested)

    def vote_on_stop(self, requested: bool) -> bool:
        decided = self.settle_stop_votes()
        self._vote = torch.tensor([int(requested or decided)], dtype=torch.int32)
        self._vote_work = dist.all_reduce(
            self._vote, op=dist.ReduceOp.MAX, group=self._control, async_op=True
        )
        return decided

    def settle_stop_votes(self) -> bool:
        work, self._vote_work = self._vote_work, None
        if work is None:
            return False
        work.wait()
        return bool(self._vote.item())

    # -- collectives ----------------------------------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        moved = tensor.to(self._collective_device())
        dist.all_reduce(moved)
        return moved.to(tensor.device)

    def _all_gather_int(self, value: int) -> list[int]:
        """Every rank's ``value``, in rank order (control-plane group)."""
        mine = torch.tensor([value], dtype=torch.int64)
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine, group=self._control)
        return [int(t) for t in gathered]  # CPU tensors of the gloo group: no device sync

    def any_rank(self, flag: bool) -> bool:
        vote = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self._control)
        return bool(vote.item())

    def broadcast_object(self, obj: T) -> T:
        box: list[Any] = [obj]
        dist.broadcast_object_list(box, src=0, group=self._control)
        return cast(T, box[0])

    def gather_object(self, obj: T) -> list[T]:
        gathered: list[Any] = [None] * self.world_size if self.is_global_zero else []
        dist.gather_object(
            obj, gathered if self.is_global_zero else None, dst=0, group=self._control
        )
        return cast(list[T], gathered)

    def exchange_outcomes(self, mine: RankOutcome, timeout_s: float) -> list[RankOutcome]:
        store = dist.distributed_c10d._get_default_store()
        return exchange_outcomes(store, mine, self.world_size, timeout_s)

    def barrier(self) -> None:
        dist.barrier(group=self._control)


_BUCKET_BYTES = 25 * 2**20


def _buckets(grads: Sequence[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """``grads`` by dtype and device, in lists of at most ~``limit`` bytes."""
    buckets: list[list[torch.Tensor]] = []
    open_: dict[tuple[torch.dtype, torch.device], tuple[list[torch.Tensor], int]] = {}
    for grad in grads:
        key = (grad.dtype, grad.device)
        bucket, size = open_.get(key, ([], 0))
        if bucket and size + grad.numel() * grad.element_size() > limit:
            buckets.append(bucket)
            bucket, size = [], 0
        bucket.append(grad)
        open_[key] = (bucket, size + grad.numel() * grad.element_size())
    buckets.extend(bucket for bucket, _ in open_.values() if bucket)
    return buckets
