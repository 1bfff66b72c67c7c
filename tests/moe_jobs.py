"""Expert-parallel scenarios for the torchrun jobs of tests/distributed_jobs.py, and the
one-process runs the tests compare them with (built by the same function)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from core import GradientAccumulationConfig, MultiGPUConfig, create_optimized_training_optimizer
from examples.moe.data import domain_sequences, vocabulary
from examples.moe.model import MoETransformer

SEQ = 8


class RecordingLoss(nn.Module):
    """Cross-entropy that keeps every micro-batch's loss (host values, CPU only)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[float] = []

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(outputs, targets)
        self.values.append(float(loss.detach()))
        return loss


def moe_model() -> MoETransformer:
    torch.manual_seed(0)
    return MoETransformer(
        vocabulary(),
        8,
        seq_len=SEQ,
        d_model=16,
        heads=2,
        layers=2,
        experts=4,
        top_k=2,
        capacity_factor=1.0,
    )


def run_moe_job(
    *,
    batch_size: int = 8,
    n: int = 64,
    epochs: int = 2,
    accumulation: int = 1,
    mode: str = "expert_parallel",
    order: list[int] | None = None,
    log_dir: Path,
    exchange: str = "auto",
    **kwargs: Any,
) -> tuple[list[float], Any, dict[str, torch.Tensor]]:
    """Micro-batch losses, results and the whole model's weights (rank 0) of one job."""
    data = domain_sequences(n, seq_len=SEQ)
    loss = RecordingLoss()
    optimizer = create_optimized_training_optimizer(
        model=moe_model(),
        train_loader=DataLoader(data, batch_size=batch_size, sampler=order),
        loss_fn=loss,
        max_epochs=epochs,
        log_dir=log_dir,
        seed=0,
        # SGD: Adam divides by sqrt(v), so two summation orders of a near-zero gradient
        # (1e-9 apart) can move a weight by the learning rate; SGD keeps them 1e-9 apart.
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        experiment_name=kwargs.pop("experiment_name", "moe"),
        progress=False,
        reports=False,
        multi_gpu_config=MultiGPUConfig(training_mode=mode, expert_token_exchange=exchange),  # type: ignore[arg-type]
        gradient_accumulation_config=GradientAccumulationConfig(accumulation_steps=accumulation),
        **kwargs,
    )
    results = anyio.run(optimizer.train)
    weights = optimizer._built.strategy.model_state_dict(optimizer.model)
    optimizer.close()
    return loss.values, results, weights


def _save(out: Path, name: str, rank: int, job: tuple[list[float], Any, dict[str, Any]]) -> None:
    losses, results, weights = job
    torch.save(
        {"losses": losses, "results": results.to_dict(), "weights": weights},
        out / f"{name}.rank{rank}.pt",
    )


def ep_fp32(out: Path, rank: int) -> None:
    _save(out, "ep_fp32", rank, run_moe_job(experiment_name="ep_fp32", log_dir=out / "logs"))


def ep_all_gather(out: Path, rank: int) -> None:
    _save(
        out,
        "ep_all_gather",
        rank,
        run_moe_job(experiment_name="ep_all_gather", exchange="all_gather", log_dir=out / "logs"),
    )


def ep_accum(out: Path, rank: int) -> None:
    # 80 samples: 40 per rank in 5 batches of 8; windows of 2, 2 and a short 1.
    _save(
        out,
        "ep_accum",
        rank,
        run_moe_job(
            experiment_name="ep_accum", n=80, epochs=1, accumulation=2, log_dir=out / "logs"
        ),
    )


def ep_bf16(out: Path, rank: int) -> None:
    _save(
        out,
        "ep_bf16",
        rank,
        run_moe_job(experiment_name="ep_bf16", epochs=1, amp_dtype="bf16", log_dir=out / "logs"),
    )


def ep_fp16(out: Path, rank: int) -> None:
    _save(
        out,
        "ep_fp16",
        rank,
        run_moe_job(experiment_name="ep_fp16", epochs=1, amp_dtype="fp16", log_dir=out / "logs"),
    )


def ep_resume(out: Path, rank: int) -> None:
    # One epoch and its checkpoint, then a new job resumes for the second: == ep_fp32.
    common: dict[str, Any] = {"log_dir": out / "ep_resume_logs", "experiment_name": "ep_resume"}
    run_moe_job(epochs=1, **common)
    _save(out, "ep_resume", rank, run_moe_job(epochs=2, resume="auto", **common))


MOE_SCENARIOS: dict[str, Callable[[Path, int], None]] = {
    fn.__name__: fn for fn in (ep_fp32, ep_all_gather, ep_accum, ep_bf16, ep_fp16, ep_resume)
}
