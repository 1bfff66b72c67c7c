from __future__ import annotations

from core.trainer.early_stopping import EarlyStopping


def test_patience_counts_epochs_without_improvement() -> None:
    stopper = EarlyStopping(patience=2)
    assert [stopper.update(v) for v in (1.0, 0.9, 0.95, 0.91)] == [False, False, False, True]
    assert stopper.best == 0.9


def test_min_delta_ignores_tiny_improvements_and_none_never_stops() -> None:
    stopper = EarlyStopping(patience=1, min_delta=0.1)
    assert stopper.update(1.0) is False
    assert stopper.update(0.95) is True
    never = EarlyStopping(patience=None)
    assert not any(never.update(1.0) for _ in range(100))


def test_state_round_trip() -> None:
    stopper = EarlyStopping(patience=3)
    stopper.update(1.0)
    stopper.update(2.0)
    restored = EarlyStopping(patience=3)
    restored.load_state_dict(stopper.state_dict())
    assert (restored.best, restored.bad_epochs) == (1.0, 1)
