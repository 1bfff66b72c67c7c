from __future__ import annotations

import torch

from core.precision.loss_scaler import DynamicLossScaler

CPU = torch.device("cpu")
OVERFLOW = torch.ones(())
CLEAN = torch.zeros(())


def scaler(**kwargs: float) -> DynamicLossScaler:
    return DynamicLossScaler(CPU, **kwargs)  # type: ignore[arg-type]


def test_backs_off_on_every_overflow_without_hysteresis() -> None:
    s = scaler(init_scale=1024.0, backoff_factor=0.5)
    for expected in (512.0, 256.0, 128.0):
        s.update(OVERFLOW)
        assert float(s.scale) == expected


def test_hysteresis_tolerates_that_many_overflows_then_backs_off() -> None:
    s = scaler(init_scale=1024.0, hysteresis=2)
    s.update(OVERFLOW)
    s.update(OVERFLOW)
    assert float(s.scale) == 1024.0  # two overflows tolerated
    s.update(OVERFLOW)
    assert float(s.scale) == 512.0  # the third backs off and refills the budget
    s.update(OVERFLOW)
    s.update(OVERFLOW)
    assert float(s.scale) == 512.0
    s.update(OVERFLOW)
    assert float(s.scale) == 256.0


def test_never_below_min_scale_nor_above_max_scale() -> None:
    s = scaler(init_scale=4.0, min_scale=1.0, growth_interval=1, max_scale=16.0)
    for _ in range(10):
        s.update(OVERFLOW)
    assert float(s.scale) == 1.0
    for _ in range(10):
        s.update(CLEAN)
    assert float(s.scale) == 16.0


def test_grows_after_growth_interval_clean_steps_and_overflow_resets_the_count() -> None:
    s = scaler(init_scale=8.0, growth_interval=3, growth_factor=2.0, hysteresis=5)
    s.update(CLEAN)
    s.update(CLEAN)
    s.update(OVERFLOW)  # tolerated, but the clean-step count restarts
    s.update(CLEAN)
    s.update(CLEAN)
    assert float(s.scale) == 8.0
    s.update(CLEAN)
    assert float(s.scale) == 16.0


def test_unscale_divides_gradients_and_flags_non_finite_values() -> None:
    s = scaler(init_scale=4.0)
    grads = [torch.full((3,), 8.0), torch.full((2,), 4.0, dtype=torch.float64)]
    found = s.unscale_(grads)
    assert found.item() == 0.0
    assert torch.equal(grads[0], torch.full((3,), 2.0))
    assert torch.equal(grads[1], torch.full((2,), 1.0, dtype=torch.float64))
    assert s.unscale_([torch.tensor([1.0, float("inf")])]).item() == 1.0
    assert s.unscale_([torch.tensor([float("nan")])]).item() == 1.0


def test_state_dict_round_trip() -> None:
    s = scaler(init_scale=64.0, hysteresis=1)
    s.update(OVERFLOW)
    s.update(OVERFLOW)
    restored = scaler(init_scale=2.0, hysteresis=1)
    restored.load_state_dict(s.state_dict())
    for a, b in zip(s.state_dict().values(), restored.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert float(restored.scale) == 32.0
