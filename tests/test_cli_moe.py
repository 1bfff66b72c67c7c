"""core-train and seed 003's example with experts: ``--example moe``,
``--parallel-strategy expert_parallel`` (with ``--gpu-mode`` in either order), ``--experts N``
reaching the model factory, and the combinations that cannot work exiting 2 with a fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from core.cli import main, run_fit
from core.cli.fit import fit_parser
from core.cli.parser import sets
from examples.gpu_training_example import fit_args
from tests.helpers import make_model

TINY = ["--model", "tests.test_cli:tiny_model", "--data", "tests.test_cli:tiny_data"]


def kwargs_model(**kwargs: int) -> nn.Module:
    """A model factory that passes every keyword on (``--model tests.test_cli_moe:...``)."""
    return make_model(**kwargs)


def test_example_moe_trains_expert_parallel_in_one_process_with_six_experts(
    tmp_path: Path,
) -> None:
    argv = [
        "--example",
        "moe",
        "--parallel-strategy",
        "expert_parallel",
        "--experts",
        "6",
        "--epochs",
        "1",
        "--batch-size",
        "256",
        "--log-dir",
        str(tmp_path),
        "--no-progress",
    ]
    outcome = run_fit(argv)
    assert outcome.exit_code == 0 and outcome.results is not None
    records = [json.loads(line) for line in (outcome.results.run_dir / "events.jsonl").open()]
    strategy = records[0]["resolved"]["strategy"]
    assert strategy["training_mode"] == "expert_parallel"
    assignment = strategy["expert_placement"]["assignment"]
    assert sorted(assignment) == [f"blocks.{b}.moe.{e}" for b in (0, 1) for e in range(6)]
    assert set(assignment.values()) == {"cpu"}
    steps = [r for r in records if r["event"] == "train_step"]
    assert len(steps) == 8  # 2048 sequences in batches of 256
    assert all(len(counts) == 6 for counts in steps[0]["moe_tokens_per_expert"].values())


def test_parallel_strategy_and_gpu_mode_set_the_mode_in_either_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mode = "distributed.training_mode"
    expert = {mode: "expert_parallel"}

    def parsed(*argv: str) -> dict[str, object]:
        return sets(fit_parser().parse(list(argv)))

    assert parsed("--parallel-strategy", "expert_parallel") == expert
    assert parsed("--parallel-strategy", "data_parallel") == {}
    assert parsed("--parallel-strategy", "data_parallel", "--gpu-mode", "auto") == {mode: "auto"}
    if not torch.cuda.is_available():  # CPU-only: expert parallelism on the CPU is legal
        assert parsed("--gpu-mode", "cpu", "--parallel-strategy", "expert_parallel") == expert
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)  # under torchrun: multi_gpu is DDP, or experts sharded
    assert parsed("--gpu-mode", "multi_gpu") == {mode: "distributed"}
    assert parsed("--gpu-mode", "multi_gpu", "--parallel-strategy", "expert_parallel") == expert
    assert parsed("--parallel-strategy", "expert_parallel", "--gpu-mode", "multi_gpu") == expert
    assert parsed(
        "--gpu-mode",
        "multi_gpu",
        "--parallel-strategy",
        "expert_parallel",
        "--parallel-strategy",
        "data_parallel",
    ) == {mode: "distributed"}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--example", "moe", "--experts", "0"],
            "--experts '0': invalid value; allowed: an integer",
        ),
        (
            ["--example", "moe", "--experts", "6", "--model-arg", "experts=4"],
            "--experts 6 and --model-arg experts=4 both set the model's experts",
        ),
        (
            [*TINY, "--experts", "3"],
            "--experts 3: the model factory tests.test_cli:tiny_model takes no 'experts' keyword",
        ),
        (
            [*TINY[:1], "tests.test_cli_moe:kwargs_model", *TINY[2:], "--experts", "3"],
            "--experts 3: the model factory tests.test_cli_moe:kwargs_model refused the "
            "'experts' keyword",
        ),
        (
            [*TINY, "--parallel-strategy", "expert_parallel"],
            "--parallel-strategy 'expert_parallel': the model (Sequential) has no "
            "core.moe.MoELayer blocks",
        ),
        (
            ["--parallel-strategy", "expert_parallel", "--training-mode", "cpu"],
            "--training-mode and --parallel-strategy both set distributed.training_mode",
        ),
        (
            ["--training-mode", "fsdp", "--gpu-mode", "cpu", "--example", "moe"],
            "--gpu-mode and --training-mode both set distributed.training_mode",
        ),
    ],
)
def test_bad_expert_command_lines_exit_2_with_a_fix(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert expected in capsys.readouterr().err


def test_modes_naming_one_device_refuse_experts_that_would_land_elsewhere(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if torch.cuda.device_count() < 2:  # stand in for a machine with 2 GPUs (parsing only)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["--gpu-mode", "cpu", "--parallel-strategy", "expert_parallel"]) == 2
    err = capsys.readouterr().err
    assert "--parallel-strategy 'expert_parallel' with --gpu-mode 'cpu': expert parallelism " in err
    assert "Fix: --gpu-mode auto" in err
    assert main(["--parallel-strategy", "expert_parallel", "--gpu-mode", "single_gpu"]) == 2
    assert "places experts over all 2 GPUs. Fix: --gpu-mode multi_gpu" in capsys.readouterr().err


def test_multi_gpu_without_torchrun_or_gpus_still_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if torch.cuda.device_count() > 1:
        pytest.skip("this machine has the GPUs")
    assert main(["--gpu-mode", "multi_gpu", "--parallel-strategy", "expert_parallel"]) == 2
    assert "--gpu-mode 'multi_gpu': needs torchrun (DDP)" in capsys.readouterr().err


def test_the_gpu_example_trains_the_moe_example_when_asked_for_experts() -> None:
    for argv in (
        ["--parallel-strategy", "expert_parallel"],
        ["--experts", "8"],
        ["--epochs", "1", "--parallel-strategy=expert_parallel"],
    ):
        assert fit_args(argv)[:2] == ["--example", "moe"] and fit_args(argv)[-len(argv) :] == argv
    for argv in ([], ["--parallel-strategy", "data_parallel"], ["--gpu-mode", "cpu"]):
        assert fit_args(argv)[:2] == ["--example", "digits"]
