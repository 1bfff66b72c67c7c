"""Early stopping's rules as objects: the config turns them on, in Lightning's order, and the
judge asks them in turn until one gives a reason."""

from __future__ import annotations

from dataclasses import dataclass

from core.config import EarlyStoppingConfig
from core.stopping.early_stopping import EarlyStopping
from core.stopping.rules import (
    DivergenceThreshold,
    NotFinite,
    Patience,
    StoppingThreshold,
    Watch,
    stopping_rules,
)


def test_the_config_turns_rules_on_in_their_order() -> None:
    assert [type(rule) for rule in stopping_rules(EarlyStoppingConfig())] == [NotFinite, Patience]
    config = EarlyStoppingConfig(
        patience=3,
        min_delta=0.1,
        check_finite=False,
        stopping_threshold=0.1,
        divergence_threshold=9.0,
    )
    assert stopping_rules(config) == [
        StoppingThreshold(0.1),
        DivergenceThreshold(9.0),
        Patience(3, 0.1),
    ]


@dataclass(frozen=True)
class Plateau:
    """A rule of the user's: stop when the value repeats exactly."""

    @classmethod
    def from_config(cls, config: EarlyStoppingConfig) -> Plateau:
        return cls()

    def check(self, value: float, watch: Watch) -> str | None:
        return f"{watch.monitor} = {value} again" if value == watch.best else None


def test_a_rule_is_one_object_the_judge_asks_before_the_rules_after_it() -> None:
    stopper = EarlyStopping(EarlyStoppingConfig(patience=5))
    stopper.rules.insert(-1, Plateau())  # before patience, which would count it as bad
    reasons = [stopper.judge(v, epochs=1, steps=1) for v in (1.0, 0.5, 0.5)]
    assert reasons == [None, None, "val_loss = 0.5 again"]
    assert (stopper.best, stopper.bad_epochs) == (0.5, 0)  # patience never saw the repeat
