"""FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over ranks.
Each block is sharded on its own, then the root.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from core.distributed.process_group import ProcessGroupStrategy

__all__ = ("FSDPStrategy", "ShardPolicy", "transformer_blocks")

ShardPolicy = Callable[[nn.Module], Iterable[nn.Module]]


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The default policy: every child of every ``nn.ModuleList`` (outermost lists only)."""
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():  # pre-order: outer lists come first
        if isinstance(module, nn.ModuleList) and id(module) not in inside:
            for block in module.children():
                blocks.append(block)
                inside.update(id(m) for m in block.modules())
    return blocks


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


class FSDPStrategy(ProcessGroupStrategy):
    """FSDP2 over a 1-D device mesh of all ranks."""

    # Forward all-gathers parameters block by block: a rank that runs out of memory inside
    # one leaves the others waiting in the next, before any vote could be taken.
    can_agree_on_oom = False

    def __init__(
        self,
        device: torch.device,
        *,
        shard_policy: ShardPolicy | None = None,
        mixed_precision: bool = False,
        reshard_after_forward: bool = True,
        **group: Any,
    ) -> None:
        super().__init__(device, "fsdp", **group)
        self.shard_policy = shard_policy or transformer_blocks
        self.mixed_precision = mixed_precision
        self.reshard_after_forward = reshard_after_forward

    def wrap_model(
        self, model: nn.Module, *, compute_dtype: torch.dtype = torch.float32
    ) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        module = self._prepare_module(model)
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        policy = (
            MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
            if self.mixed_precision and compute_dtype != torch.float32
            else MixedPrecisionPolicy()
        )
        for part in [*self.shard_policy(module), module]:  # each block on its own, then the root
            fully_shard(
                part, mesh=mesh, mp_policy=policy, reshard_after_forward=self.reshard_after_forward
            )
        return module

    def no_backward_sync(self, model: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        return _gradient_sync_off(model) if enabled else nullcontext()

    def total_norm(self, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        return _full(torch.nn.utils.get_total_norm(grads, norm_type=2.0))

    def reduce_found_inf(self, found_inf: torch.Tensor | None) -> torch.Tensor | None:
        if found_inf is None:
            return None
        # Each rank checked only its own shard of the gradients.
        dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)
        return found_inf

    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)

    # Sharded checkpoints: every rank writes its shards; ``.metadata`` is written last.
    def checkpoint_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
        return {}

    def save_sharded(self, model: nn.Module, optimizer: Optimizer, path: Path) -> None:
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        model_state, optim_state = get_state_dict(model, optimizer)
        dcp_save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(path))

    def load_checkpoint_state(
        self, model: nn.Module, optimizer: Optimizer, payload: dict[str, Any], sharded: Path
    ) -> None:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        model_state, optim_state = get_state_dict(model, optimizer)
        dcp_load({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(sharded))
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)


@contextmanager
def _gradient_sync_off(model: nn.Module) -> Iterator[None]:
    from torch.distributed.fsdp import FSDPModule

    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
