from __future__ import annotations

import math
import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from core.precision.loss_scaler import DynamicLossScaler

CPU = torch.device("cpu")
OVERFLOW = torch.ones(())
CLEAN = torch.zeros(())
OV, CL = True, False  # an overflowing step, a clean step


def scaler(**kwargs: Any) -> DynamicLossScaler:
    return DynamicLossScaler(CPU, **kwargs)


def scales_after(s: DynamicLossScaler, flags: Sequence[bool]) -> list[float]:
    """Feed one overflow flag per step; the scale after each update."""
    out = []
    for overflow in flags:
        s.update(OVERFLOW if overflow else CLEAN)
        out.append(float(s.scale))
    return out


def overflows_left(s: DynamicLossScaler) -> int:
    return int(s.state_dict()["overflows_left"])


# --------------------------------------------------------------------------- our rules


def test_default_hysteresis_backs_off_on_every_overflow() -> None:
    s = scaler(init_scale=1024.0, backoff_factor=0.5)
    assert scales_after(s, [OV, OV, OV]) == [512.0, 256.0, 128.0]


def test_hysteresis_counts_the_overflows_that_trigger_a_back_off() -> None:
    s = scaler(init_scale=1024.0, hysteresis=3)
    assert overflows_left(s) == 2
    # The first two overflows are absorbed, the third backs off; the budget is not
    # refilled by the back-off, so every further overflow backs off too.
    assert scales_after(s, [OV, OV, OV, OV, OV]) == [1024.0, 1024.0, 512.0, 256.0, 128.0]
    assert overflows_left(s) == 0


def test_without_consecutive_hysteresis_clean_steps_do_not_refill_the_budget() -> None:
    s = scaler(init_scale=1024.0, hysteresis=2, growth_interval=100)
    # absorbed, clean, back off (budget spent), clean, back off, ...
    assert scales_after(s, [OV, CL, OV, CL, OV, CL, OV]) == [
        1024.0,
        1024.0,
        512.0,
        512.0,
        256.0,
        256.0,
        128.0,
    ]


def test_consecutive_hysteresis_refills_the_budget_after_every_clean_step() -> None:
    s = scaler(init_scale=1024.0, hysteresis=2, consecutive_hysteresis=True, growth_interval=100)
    assert scales_after(s, [OV, CL, OV, CL, OV, CL, OV]) == [1024.0] * 7
    assert overflows_left(s) == 0
    # The last overflow spent the budget: the next two back off (a back-off does not
    # refill); a clean step refills, then the 2nd overflow in a row backs off.
    assert scales_after(s, [OV, OV, CL, OV, OV]) == [512.0, 256.0, 256.0, 256.0, 128.0]


def test_growth_refills_the_budget() -> None:
    s = scaler(init_scale=1024.0, hysteresis=2, growth_interval=2)
    # absorbed (budget spent), 2 clean steps grow and refill, absorbed again, back off.
    assert scales_after(s, [OV, CL, CL, OV, OV]) == [1024.0, 1024.0, 2048.0, 2048.0, 1024.0]


def test_never_below_min_scale_nor_above_max_scale() -> None:
    s = scaler(init_scale=4.0, min_scale=1.0, growth_interval=1, max_scale=16.0)
    for _ in range(10):
        s.update(OVERFLOW)
    assert float(s.scale) == 1.0
    for _ in range(10):
        s.update(CLEAN)
    assert float(s.scale) == 16.0


def test_grows_after_growth_interval_clean_steps_and_overflow_resets_the_count() -> None:
    s = scaler(init_scale=8.0, growth_interval=3, growth_factor=2.0, hysteresis=6)
    s.update(CLEAN)
    s.update(CLEAN)
    s.update(OVERFLOW)  # absorbed, but the clean-step count restarts
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
    s = scaler(init_scale=64.0, hysteresis=2)
    s.update(OVERFLOW)
    s.update(OVERFLOW)
    restored = scaler(init_scale=2.0, hysteresis=2)
    restored.load_state_dict(s.state_dict())
    assert set(restored.state_dict()) == {"scale", "growth_tracker", "overflows_left"}
    for a, b in zip(s.state_dict().values(), restored.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert float(restored.scale) == 32.0


# ------------------------------------------------------------ torch.amp.GradScaler


class CountingSGD(torch.optim.SGD):
    """SGD that counts the steps it really takes."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.steps_taken = 0

    def step(self, closure: Any = None) -> Any:
        self.steps_taken += 1
        return super().step(closure)


def _model() -> tuple[torch.nn.Linear, CountingSGD]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, CountingSGD(model.parameters(), lr=0.05)


def _loss(model: torch.nn.Module, step: int, overflow: bool) -> torch.Tensor:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
    if overflow:
        x[0, 0] = float("inf")  # the fp16 backward then yields inf/NaN gradients
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    return out.float().pow(2).mean()


def _run_ours(flags: Sequence[bool], **kwargs: Any) -> tuple[list[float], list[int], Any]:
    model, opt = _model()
    s = scaler(**kwargs)
    scales, skipped = [], []
    for step, overflow in enumerate(flags):
        s.scale_loss(_loss(model, step, overflow)).backward()
        found_inf = s.unscale_(p.grad for p in model.parameters() if p.grad is not None)
        before = opt.steps_taken
        if not found_inf.item():  # the caller skips the step on overflow
            opt.step()
        s.update(found_inf)
        opt.zero_grad()
        scales.append(float(s.scale))
        if opt.steps_taken == before:
            skipped.append(step)
    return scales, skipped, model.state_dict()


def _run_grad_scaler(
    flags: Sequence[bool], *, init_scale: float, growth_interval: int
) -> tuple[list[float], list[int], Any]:
    model, opt = _model()
    gs = torch.amp.GradScaler(
        "cpu",
        init_scale=init_scale,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=growth_interval,
    )
    scales, skipped = [], []
    for step, overflow in enumerate(flags):
        gs.scale(_loss(model, step, overflow)).backward()
        before = opt.steps_taken
        gs.step(opt)
        gs.update()
        opt.zero_grad()
        scales.append(gs.get_scale())
        if opt.steps_taken == before:
            skipped.append(step)
    return scales, skipped, model.state_dict()


def _random_flags(seed: int, n: int, p_overflow: float) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() < p_overflow for _ in range(n)]


GRAD_SCALER_SEQUENCES = {
    "scripted": [
        OV,
        CL,
        CL,
        CL,
        CL,
        CL,
        CL,
        OV,
        OV,
        CL,
        CL,
        OV,
        CL,
        CL,
        CL,
        CL,
        OV,
        OV,
        OV,
        CL,
        CL,
        CL,
        CL,
        CL,
        CL,
        CL,
    ],
    "random-0": _random_flags(0, 60, 0.3),
    "random-1": _random_flags(1, 60, 0.15),
    "random-2": _random_flags(2, 60, 0.5),
}


@pytest.mark.parametrize("consecutive", [False, True])
@pytest.mark.parametrize("growth_interval", [1, 3])
@pytest.mark.parametrize("name", sorted(GRAD_SCALER_SEQUENCES))
def test_hysteresis_1_matches_torch_grad_scaler(
    name: str, growth_interval: int, consecutive: bool
) -> None:
    flags = GRAD_SCALER_SEQUENCES[name]
    init_scale, min_scale, max_scale = 2.0**10, 2.0**-40, 2.0**60
    ours = _run_ours(
        flags,
        init_scale=init_scale,
        growth_interval=growth_interval,
        hysteresis=1,
        consecutive_hysteresis=consecutive,
        min_scale=min_scale,
        max_scale=max_scale,
    )
    theirs = _run_grad_scaler(flags, init_scale=init_scale, growth_interval=growth_interval)
    # GradScaler has no bounds: the comparison is only meaningful if ours never hit them.
    assert all(min_scale < x < max_scale for x in ours[0])
    assert ours[0] == theirs[0]  # scale trajectory
    assert ours[1] == theirs[1]  # skipped steps
    # Every injected overflow is skipped; with growth_interval=1 the scale also climbs
    # until the fp16 backward overflows on its own, which both scalers must see alike.
    assert {i for i, f in enumerate(flags) if f} <= set(ours[1])
    for key, value in ours[2].items():  # weights after the SGD steps, bit for bit
        assert torch.equal(value, theirs[2][key]), key


# ------------------------------------------------------------------------- DeepSpeed


class DeepSpeedRule:
    """DeepSpeed's dynamic loss scaling rule (``DynamicLossScaler.update_scale``), restated.

    Source: deepspeedai/DeepSpeed, deepspeed/runtime/fp16/loss_scaler.py. ``hysteresis`` is
    DeepSpeed's ``delayed_shift``, ``scale_window`` our ``growth_interval``; the scale is
    multiplied or divided by ``scale_factor``. Left out: logging, and the error DeepSpeed
    raises at ``min_scale`` (``raise_error_at_min_scale=False`` here). Added: ``max_scale``,
    which DeepSpeed does not have (infinite by default, as there).
    """

    def __init__(
        self,
        init_scale: float,
        scale_window: int,
        min_scale: float,
        hysteresis: int,
        consecutive_hysteresis: bool,
        max_scale: float = math.inf,
        scale_factor: float = 2.0,
    ) -> None:
        self.cur_scale, self.scale_window, self.scale_factor = (
            init_scale,
            scale_window,
            scale_factor,
        )
        self.min_scale, self.max_scale = min_scale, max_scale
        self.delayed_shift = self.cur_hysteresis = hysteresis
        self.consecutive_hysteresis = consecutive_hysteresis
        self.cur_iter, self.last_overflow_iter = 0, -1

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:  # budget spent: back off
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale = min(self.cur_scale * self.scale_factor, self.max_scale)
        self.cur_iter += 1


def _both(
    flags: Sequence[bool],
    *,
    init_scale: float,
    scale_window: int,
    hysteresis: int,
    consecutive: bool = False,
    min_scale: float = 1.0,
) -> tuple[list[float], list[float]]:
    """Scale trajectories of the reference rule and of our scaler for the same flags."""
    ref = DeepSpeedRule(init_scale, scale_window, min_scale, hysteresis, consecutive)
    ref_scales = []
    for overflow in flags:
        ref.update_scale(overflow)
        ref_scales.append(ref.cur_scale)
    ours = scaler(
        init_scale=init_scale,
        growth_interval=scale_window,
        hysteresis=hysteresis,
        consecutive_hysteresis=consecutive,
        min_scale=min_scale,
        max_scale=2.0**60,
    )
    return ref_scales, scales_after(ours, flags)


# DeepSpeed's own unit tests (tests/unit/runtime/half_precision/test_dynamic_loss_scale.py),
# their expected values written out.


@pytest.mark.parametrize("min_scale", [1.0, 2.0])
def test_deepspeed_all_overflow(min_scale: float) -> None:
    # initial_scale_power 4, loss_scale_window 2, hysteresis 1: every overflow halves,
    # down to the minimum (1 for the fused optimizer test, 2 for the unfused one).
    expected = [max(2.0 ** (3 - i), min_scale) for i in range(8)]
    assert expected[:3] == [8.0, 4.0, 2.0]
    ref, ours = _both([OV] * 8, init_scale=16.0, scale_window=2, hysteresis=1, min_scale=min_scale)
    assert ref == ours == expected


def test_deepspeed_some_overflow() -> None:
    # initial_scale_power 8, window 2, hysteresis 1: two overflows -> 2**6; window + 1
    # clean steps grow once -> 2**7; one overflow -> 2**6.
    ref, ours = _both([OV, OV, CL, CL, CL, OV], init_scale=2.0**8, scale_window=2, hysteresis=1)
    assert ref == ours
    assert ours[1] == 2.0**6
    assert ours[4] == 2.0**7
    assert ours[5] == 2.0**6


def test_deepspeed_no_overflow() -> None:
    # initial_scale_power 8, window 2, ten clean steps: the scale doubles every 2 steps.
    # Counted as GradScaler counts (growth at the 2nd, 4th, ... clean step); DeepSpeed's
    # current test, written for a rule that waits scale_window + 1 clean steps for the
    # first growth, expects each doubling one step later.
    ref, ours = _both([CL] * 10, init_scale=2.0**8, scale_window=2, hysteresis=1)
    assert ref == ours == [2.0 ** (8 + k // 2) for k in range(1, 11)]


def test_deepspeed_hysteresis_3() -> None:
    # hysteresis 3, four overflows: the first two are absorbed, then each one halves.
    ref, ours = _both([OV] * 4, init_scale=2.0**8, scale_window=1000, hysteresis=3)
    assert ref == ours == [2.0**8, 2.0**8, 2.0**7, 2.0**6]


def test_deepspeed_consecutive_hysteresis() -> None:
    # hysteresis 2 with consecutive_hysteresis: a clean step refills the budget, so
    # isolated overflows never lower the scale.
    flags = [OV, CL] * 4
    ref, ours = _both(flags, init_scale=2.0**8, scale_window=1000, hysteresis=2, consecutive=True)
    assert ref == ours == [2.0**8] * 8
    # Without it the same steps back off from the second overflow on.
    ref, ours = _both(flags, init_scale=2.0**8, scale_window=1000, hysteresis=2)
    assert ref == ours == [2.0**8, 2.0**8, 2.0**7, 2.0**7, 2.0**6, 2.0**6, 2.0**5, 2.0**5]


def test_deepspeed_hysteresis_survives_a_checkpoint() -> None:
    # hysteresis 3, one overflow, save and restore: one overflow is spent (DeepSpeed's
    # cur_hysteresis == 2), so the next overflow is the last one absorbed.
    s = scaler(init_scale=2.0**8, growth_interval=1000, hysteresis=3)
    s.update(OVERFLOW)
    restored = scaler(init_scale=2.0**8, growth_interval=1000, hysteresis=3)
    restored.load_state_dict(s.state_dict())
    assert overflows_left(restored) == 3 - 1 - 1
    assert scales_after(restored, [OV, OV]) == [2.0**8, 2.0**7]
    # Through the engine, hysteresis 2, window 100: first overflow absorbed; after a
    # restore the next one backs off.
    s = scaler(init_scale=2.0**8, growth_interval=100, hysteresis=2)
    assert scales_after(s, [OV]) == [2.0**8]
    restored = scaler(init_scale=2.0**8, growth_interval=100, hysteresis=2)
    restored.load_state_dict(s.state_dict())
    assert scales_after(restored, [OV]) == [2.0**7]


def _bounds_hitting_flags(seed: int, p_overflow: float) -> list[bool]:
    """A burst of overflows (down to min_scale), a long clean run (up to max_scale), then
    random steps."""
    return [OV] * 30 + [CL] * 60 + _random_flags(seed, 250, p_overflow)


@pytest.mark.parametrize(
    ("hysteresis", "consecutive", "growth_interval"),
    [
        (1, False, 1),
        (1, True, 3),
        (2, False, 2),
        (2, True, 2),
        (3, False, 3),
        (3, True, 1),
        (4, False, 5),
        (5, True, 4),
    ],
)
@pytest.mark.parametrize(("seed", "p_overflow"), [(0, 0.1), (1, 0.3), (2, 0.5), (3, 0.7)])
def test_matches_the_deepspeed_rule_step_by_step(
    hysteresis: int, consecutive: bool, growth_interval: int, seed: int, p_overflow: float
) -> None:
    min_scale, max_scale = 0.25, 2.0**6
    ref = DeepSpeedRule(2.0**4, growth_interval, min_scale, hysteresis, consecutive, max_scale)
    ours = scaler(
        init_scale=2.0**4,
        growth_interval=growth_interval,
        hysteresis=hysteresis,
        consecutive_hysteresis=consecutive,
        min_scale=min_scale,
        max_scale=max_scale,
    )
    seen = set()
    for step, overflow in enumerate(_bounds_hitting_flags(seed, p_overflow)):
        ref.update_scale(overflow)
        ours.update(OVERFLOW if overflow else CLEAN)
        assert float(ours.scale) == ref.cur_scale, step
        assert overflows_left(ours) == ref.cur_hysteresis - 1, step
        seen.add(ref.cur_scale)
    assert {min_scale, max_scale} <= seen


def test_matches_deepspeed_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    ds = pytest.importorskip(
        "deepspeed.runtime.fp16.loss_scaler", reason="deepspeed is not installed"
    )
    monkeypatch.setattr(ds, "dist", SimpleNamespace(get_rank=lambda: 0))  # no process group

    def theirs(window: int, hysteresis: int, consecutive: bool) -> Any:
        return ds.DynamicLossScaler(
            init_scale=2.0**4,
            scale_window=window,
            min_scale=0.25,
            delayed_shift=hysteresis,
            consecutive_hysteresis=consecutive,
            raise_error_at_min_scale=False,
        )

    probe = theirs(2, 1, False)
    probe.update_scale(False)
    probe.update_scale(False)
    same_growth_count = probe.cur_scale == 2.0**5
    for window in (2, 3, 10**6):  # 10**6: never grows, only hysteresis and back-offs count
        if window != 10**6 and not same_growth_count:
            continue  # this version waits scale_window + 1 clean steps for its first growth
        for hysteresis, consecutive in [(1, False), (2, False), (2, True), (3, False), (3, True)]:
            ds_scaler = theirs(window, hysteresis, consecutive)
            ours = scaler(
                init_scale=2.0**4,
                growth_interval=window,
                hysteresis=hysteresis,
                consecutive_hysteresis=consecutive,
                min_scale=0.25,
                max_scale=2.0**100,  # DeepSpeed has no upper bound
            )
            for seed in range(3):
                for overflow in [OV] * 8 + [CL] * 12 + _random_flags(seed, 100, 0.4):
                    ds_scaler.update_scale(overflow)
                    ours.update(OVERFLOW if overflow else CLEAN)
                    assert float(ours.scale) == ds_scaler.cur_scale
                    assert overflows_left(ours) == ds_scaler.cur_hysteresis - 1
