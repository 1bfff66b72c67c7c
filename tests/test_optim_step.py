from __future__ import annotations

import pytest
import torch

from core.distributed.environment import DistributedEnvironment
from core.loop.step import (
    DeviceSkippingStepper,
    OptimizerStepper,
    default_optimizer,
    stepper_for,
)
from tests.helpers import make_model


def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = make_model()
    optimizer = default_optimizer(model.parameters(), lr=0.1, weight_decay=0.0)
    model(torch.randn(4, 8)).sum().backward()
    return model, optimizer


@pytest.mark.parametrize("kind", [OptimizerStepper, DeviceSkippingStepper])
@pytest.mark.parametrize(
    ("found_inf", "norm", "skipped"),
    [
        (None, 1.0, False),
        (None, float("nan"), True),  # the non-finite guard
        (torch.ones(()), 1.0, True),  # an fp16 overflow
        (torch.zeros(()), 1.0, False),
    ],
)
def test_both_steppers_skip_exactly_the_same_steps(
    kind: type[OptimizerStepper], found_inf: torch.Tensor | None, norm: float, skipped: bool
) -> None:
    model, optimizer = fresh()
    before = [p.detach().clone() for p in model.parameters()]
    flag = kind(optimizer, guard_nonfinite=True).step(found_inf, torch.tensor(norm))
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert unchanged is skipped
    steps = {float(s["step"]) for s in optimizer.state.values()} if optimizer.state else {0.0}
    assert steps == ({0.0} if skipped else {1.0})  # the optimizer's step count too
    assert bool(flag) is skipped


def test_without_the_guard_or_a_flag_the_step_is_plain() -> None:
    _, optimizer = fresh()
    assert OptimizerStepper(optimizer, guard_nonfinite=False).step(None, torch.tensor(1.0)) is None


def test_the_device_skipping_stepper_is_chosen_for_fused_optimizers_on_cuda_only() -> None:
    _, optimizer = fresh()
    assert (
        type(stepper_for(optimizer, torch.device("cpu"), guard_nonfinite=True)) is OptimizerStepper
    )
    on_cuda = stepper_for(optimizer, torch.device("cuda"), guard_nonfinite=True)
    assert type(on_cuda) is DeviceSkippingStepper
    sgd = torch.optim.SGD(make_model().parameters(), lr=0.1)
    assert type(stepper_for(sgd, torch.device("cuda"), guard_nonfinite=True)) is OptimizerStepper


def test_torchrun_restarts_get_a_store_prefix_per_attempt() -> None:
    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "29500",
    }
    plain = DistributedEnvironment.from_environ(env)
    assert plain is not None and plain.agent_rendezvous() is None
    elastic = DistributedEnvironment.from_environ(
        env | {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
    )
    assert elastic is not None and elastic.agent_rendezvous() == ("h", 29500, "core/attempt_2/")
