"""Expert parallelism under torchrun: each rank holds ``E / world_size`` experts of every MoE
layer; everything else is data parallel (DDP). Tokens reach the experts by all-to-all
(:mod:`core.moe.exchange`); gradients, norms and checkpoints: docs/experts.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from core.distributed.ddp import DDPStrategy
from core.errors import ConfigError
from core.moe.dispatch import ExpertShard
from core.moe.exchange import AllGatherExchange, TokenExchange, probe_all_to_all
from core.moe.probe import require_moe_layers

__all__ = ("ExpertParallelStrategy", "TokenExchangeChoice")

TokenExchangeChoice = Literal["auto", "all_to_all", "all_gather"]


def _flat() -> Any:
    """Flattened optimizer state (DCP imported on first use: half a second)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


class ExpertParallelStrategy(DDPStrategy):
    """Experts sharded over the ranks, dense parameters under DDP."""

    can_agree_on_oom = False  # a rank out of memory mid-forward leaves the others in all-to-all

    def __init__(
        self, device: torch.device, *, token_exchange: TokenExchangeChoice = "auto", **ddp: Any
    ) -> None:
        super().__init__(device, **ddp)
        self.name = "expert_parallel"
        self.token_exchange = token_exchange
        self.exchange: TokenExchange | None = None
        self.exchange_note = ""
        self._expert_params: list[nn.Parameter] = []
        self._layers: dict[str, dict[str, Any]] = {}

    def describe(self) -> dict[str, Any]:
        exchange = None if self.exchange is None else self.exchange.name
        return super().describe() | {
            "expert_parallel": {
                "token_exchange": exchange,
                "note": self.exchange_note,
                "dense": "ddp",
                "layers": self._layers,
            }
        }

    def _choose_exchange(self) -> TokenExchange:
        if self.token_exchange == "all_gather":
            self.exchange_note = "all_gather asked for (token_exchange='all_gather')"
            return AllGatherExchange()
        if probe_all_to_all():
            self.exchange_note = f"{dist.get_backend()} runs all_to_all_single"
            return TokenExchange()
        if self.token_exchange == "all_to_all":
            raise ConfigError(
                f"token_exchange='all_to_all', but the {dist.get_backend()} backend does not run "
                "all_to_all_single. Fix: token_exchange='auto' (falls back to all_gather)."
            )
        self.exchange_note = f"{dist.get_backend()} has no all_to_all_single: built from all_gather"
        return AllGatherExchange()

    def wrap_model(
        self, model: nn.Module, *, compute_dtype: torch.dtype = torch.float32
    ) -> nn.Module:
        layers = require_moe_layers(model, "training_mode='distributed' (DDP)")
        self.exchange = self._choose_exchange()
        ignored: list[str] = []
        for name, layer in layers:
            self._shard(name, layer, self.exchange)
            prefix = f"{name}.experts." if name else "experts."
            ignored += [prefix + n for n, _ in layer.experts.named_parameters()]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
        return super().wrap_model(model, compute_dtype=compute_dtype)

    def _shard(self, name: str, layer: Any, exchange: TokenExchange) -> None:
        experts, size = layer.num_experts, self.world_size
        if experts % size:
            raise ConfigError(
                f"MoE layer {name!r} has {experts} experts, which do not divide over "
                f"world_size={size} ranks. Fix: a number of experts that is a multiple of "
                f"{size}, or --nproc_per_node dividing {experts}."
            )
        shard = ExpertShard(self.rank, size, experts // size, exchange)
        # A model wrapped a second time (initialize_training, then a run of the same model)
        # is already sharded: its gradient hooks are not added twice.
        first_time = layer.shard is None
        layer.experts.keep_only(shard.owned())
        layer.shard = shard
        for parameter in layer.experts.parameters():
            if first_time:
                parameter.register_hook(_divide_by(size))
            self._expert_params.append(parameter)
        self._layers[name] = {
            "experts": experts,
            "experts_per_rank": shard.experts_per_rank,
            "held": shard.owned(),
        }

    # -- global quantities ----------------------------------------------------------------
    def total_norm(self, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        expert_grads = {id(p.grad) for p in self._expert_params if p.grad is not None}
        dense = [g for g in grads if id(g) not in expert_grads]
        experts = [g for g in grads if id(g) in expert_grads]
        squares = torch.stack(
            [_square_norm(dense, self.device), _square_norm(experts, self.device)]
        )
        reduced = self.all_reduce_sum(squares[1:].clone())  # the experts' parts, every rank's
        return (squares[0] + reduced[0]).sqrt()

    def reduce_found_inf(self, found_inf: torch.Tensor | None) -> torch.Tensor | None:
        if found_inf is None:
            return None
        moved = found_inf.to(self._collective_device())
        dist.all_reduce(moved, op=dist.ReduceOp.MAX)  # each rank checked only its experts
        return moved.to(found_inf.device)

    # -- state ----------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The whole model on rank 0 (every rank's experts gathered); empty elsewhere."""
        local = {k: v.detach().cpu() for k, v in self.unwrap(model).state_dict().items()}
        mine = {k: v for k, v in local.items() if _is_expert_key(k, self._layers)}
        gathered = self.gather_object(mine)
        if not self.is_global_zero:
            return {}
        full = dict(local)
        for part in gathered:
            full.update(part)
        return full

    def checkpoint_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
        return {}

    def save_sharded(self, model: nn.Module, optimizer: Optimizer, path: Path) -> None:
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        model_state, optim_state = get_state_dict(self.unwrap(model), optimizer, options=_flat())
        dcp_save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(path))

    def load_checkpoint_state(
        self, model: nn.Module, optimizer: Optimizer, payload: dict[str, Any], sharded: Path
    ) -> None:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        module, flat = self.unwrap(model), _flat()
        model_state, optim_state = get_state_dict(module, optimizer, options=flat)
        dcp_load({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(sharded))
        set_state_dict(
            module,
            optimizer,
            model_state_dict=model_state,
            optim_state_dict=optim_state,
            options=flat,
        )


def _divide_by(size: int) -> Any:
    def hook(grad: torch.Tensor) -> torch.Tensor:
        return grad / size

    return hook


def _square_norm(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    if not grads:
        return torch.zeros((), device=device)
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0).float().square()


def _is_expert_key(key: str, layers: dict[str, Any]) -> bool:
    return any(key.startswith(f"{name}.experts." if name else "experts.") for name in layers)
