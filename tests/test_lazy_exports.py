"""``import core`` loads what a run uses; the other public names load when first asked for,
and every name of ``core.__all__`` still resolves where it always did."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import core

LOADED_ON_FIRST_USE = (
    "core.cli",
    "core.facades.eager",
    "core.facades.gpu_utilization_mixed_precision_system",
    "core.facades.mixed_precision_training",
    "core.facades.multi_gpu_training",
    "core.losses",
    "core.memory.optimizer",
    "core.memory.profile",
    "core.reports.expert_plots",
    "core.reports.plots",
    "core.reports.summary",
    "core.trackers",
    "core.trainer.cluster.placement",
    "core.tuning",
    "matplotlib",
    "mlflow",
    "ray",
    "tensorboard",
    "wandb",
)
"""Modules a run does not need: the command line, the founding facades' extras, trackers,
reports, tuning, memory tools, Ray runs' side, and the libraries only they import."""

FRESH_IMPORT = """
import json, sys
import core
after_import = sorted(sys.modules)
kinds = {name: type(getattr(core, name)).__name__ for name in core.__all__}
print(json.dumps({"after_import": after_import, "kinds": kinds, "dir": dir(core)}))
"""


def test_import_core_loads_what_a_run_uses_and_every_name_resolves() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRESH_IMPORT], capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout)
    loaded = [
        module
        for module in seen["after_import"]
        if any(module == lazy or module.startswith(f"{lazy}.") for lazy in LOADED_ON_FIRST_USE)
    ]
    assert loaded == []
    assert "core.trainer.job.orchestrator" in seen["after_import"]  # a run's own modules load
    assert sorted(seen["kinds"]) == sorted(core.__all__)  # each name resolved, none raised
    assert set(core.__all__) <= set(seen["dir"])

    from core import CSVLogger, find_learning_rate
    from core.trackers.csv import CSVLogger as defined
    from core.tuning.lr_finder import find_learning_rate as defined_function

    assert CSVLogger is defined and find_learning_rate is defined_function
    with pytest.raises(AttributeError, match="module 'core' has no attribute 'CSVLoger'"):
        core.CSVLoger  # noqa: B018  (the lookup is the test)
