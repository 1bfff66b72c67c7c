"""core-train: every leaf of the config tree has a flag, the shorthand switches set the leaves
they name, TOML configs round-trip and flags override them, bad command lines exit 2 naming
the flag, the value and what is allowed, fit trains through the orchestrator, and
core.load_model rebuilds the model of its checkpoints."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR
from torch.utils.data import DataLoader

from core import Factory, SignalReceived, TrainingConfig, load_model
from core.checkpointing.model_loading import model_factory_of
from core.cli import _commands, main, run_fit
from core.cli.fit import fit_parser, resolve_config
from core.cli.flags import LeafAction
from core.cli.leaves import plain
from core.cli.parser import sets
from core.cli.recipes import scheduler_factory, steps_per_epoch
from core.cli.reference import PARSERS, flags_of, reference_markdown
from core.cli.toml import dumps, loads
from core.errors import resume_phrased_for
from tests.helpers import make_classification, make_model

ROOT = Path(__file__).resolve().parents[1]
SEED_SWITCHES = (
    "--epochs",
    "--batch-size",
    "--auto-batch-size",
    "--grad-accum",
    "--accumulation-steps",
    "--mixed-precision",
    "--precision-type",
    "--no-amp",
    "--use-amp",
    "--compile",
    "--use-compile",
    "--no-compile",
    "--compile-mode",
    "--channels-last",
    "--no-channels-last",
    "--use-gradient-checkpointing",
    "--num-workers",
    "--gpu-mode",
    "--parallel-strategy",
    "--monitor-gpu",
    "--lr",
    "--label-smoothing",
    "--focal-loss",
    "--grad-clip",
    "--scheduler",
    "--resume",
    "--log-dir",
    "--experiment",
    "--randaugment",
    "--mixup",
)


def tiny_model(hidden: int = 16) -> nn.Module:
    """Model factory for ``--model tests.test_cli:tiny_model``."""
    return make_model(hidden=hidden)


def tiny_data(batch_size: int, num_workers: int) -> tuple[DataLoader[Any], DataLoader[Any]]:
    """Data factory for ``--data tests.test_cli:tiny_data``: 10 batches of 16 samples."""
    train = DataLoader(make_classification(160), batch_size=batch_size, shuffle=True)
    return train, DataLoader(make_classification(64, seed=1), batch_size=32)


def margin_step(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    """``--training-step tests.test_cli:margin_step``: the loss, and a value to log."""
    inputs, targets = batch
    outputs = model(inputs)
    loss = nn.functional.cross_entropy(outputs, targets)
    return {"loss": loss, "outputs": outputs, "twice": 2 * loss.detach()}


def scored_step(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    """``--validation-step tests.test_cli:scored_step``: the loss and a score per batch."""
    inputs, targets = batch
    outputs = model(inputs)
    hits = (outputs.argmax(dim=1) == targets).float().mean()
    return {"loss": nn.functional.cross_entropy(outputs, targets), "hits": hits}


class SlowSamples(torch.utils.data.Dataset[Any]):
    """160 samples, 5 ms each: a run that a test can stop in its first epochs."""

    def __init__(self) -> None:
        self.samples = make_classification(160)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        time.sleep(0.005)
        return self.samples[index]


def slow_data(batch_size: int, num_workers: int) -> tuple[DataLoader[Any], None]:
    """Data factory for ``--data tests.test_cli:slow_data``."""
    return DataLoader(SlowSamples(), batch_size=batch_size), None


def tree_leaves(node: object, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for field in dataclasses.fields(node):  # type: ignore[arg-type]
        value = getattr(node, field.name)
        if dataclasses.is_dataclass(value):
            out += tree_leaves(value, f"{prefix}{field.name}.")
        else:
            out.append((f"{prefix}{field.name}", value))
    return out


def test_every_leaf_of_the_tree_has_a_flag_that_sets_it() -> None:
    parser = fit_parser()
    actions = {a.leaf.path: a for a in parser._actions if isinstance(a, LeafAction)}
    leaves = tree_leaves(TrainingConfig())
    assert len(leaves) > 90 and {path for path, _ in leaves} == set(actions)
    for path, default in leaves:
        flag = actions[path].leaf.flag
        shown = plain(default)
        argv = (
            [flag]
            if shown is True
            else [f"--no-{flag[2:]}"]
            if shown is False
            else ([flag, ",".join(map(str, shown)) if isinstance(shown, list) else str(shown)])
        )
        assert sets(parser.parse(argv)) == {path: default}, argv
    assert parser.parse([]).__dict__.get("tree", {}) == {}  # unset flags leave the tree alone


def test_seed_switches_set_the_leaves_they_name() -> None:
    argv = [
        "--epochs",
        "3",
        "--grad-accum",
        "2",
        "--no-amp",
        "--precision-type",
        "bf16",
        "--use-compile",
        "--compile-mode",
        "max-autotune",
        "--no-channels-last",
        "--use-gradient-checkpointing",
        "--num-workers",
        "0",
        "--lr",
        "0.01",
        "--grad-clip",
        "1",
        "--experiment",
        "seed",
        "--resume",
        "auto",
        "--log-dir",
        "runs",
        "--auto-batch-size",
        "--gpu-mode",
        "cpu",
        "--monitor-gpu",
        "--parallel-strategy",
        "data_parallel",
    ]
    assert sets(fit_parser().parse(argv)) == {
        "run.max_epochs": 3,
        "accumulation.accumulation_steps": 2,
        "precision.enable_amp": False,
        "precision.dtype": "bf16",
        "transforms.compile": True,
        "transforms.compile_mode": "max-autotune",
        "transforms.channels_last": False,
        "transforms.activation_checkpointing": True,
        "data.loader.num_workers": 0,
        "optim.learning_rate": 0.01,
        "optim.max_grad_norm": 1.0,
        "run.experiment_name": "seed",
        "checkpoint.resume": "auto",
        "run.log_dir": "runs",
        "memory.auto_batch_size": True,
        "distributed.training_mode": "cpu",
        "monitor.enabled": True,
        "distributed.enable_gpu_monitoring": True,
    }
    parser = fit_parser()
    config = resolve_config(parser.parse(["--monitor-gpu", "--example", "digits"]), parser)
    assert config.monitor.interval_s == 0.25 and config.run.experiment_name == "digits"


def test_multi_gpu_is_ddp_under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    namespace = fit_parser().parse(["--gpu-mode", "multi_gpu"])
    assert sets(namespace) == {"distributed.training_mode": "distributed"}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--epochs", "2", "--max-epochs", "3"],
            "--max-epochs and --epochs both set run.max_epochs",
        ),
        (["--use-amp", "--no-amp"], "--no-amp and --use-amp both set precision.enable_amp"),
        (
            ["--precision-type", "fp8"],
            "--precision-type 'fp8': invalid choice; allowed: auto, fp16",
        ),
        (["--epochs", "x"], "--epochs 'x': invalid value; allowed: an integer"),
        (["--compile", "maybe"], "--compile 'maybe': invalid value; allowed: auto; or true or"),
        (["--epoch", "3"], "--epoch: unknown flag; did you mean --epochs?"),
        (["--lr", "-1", "--example", "digits"], "--lr=-1.0 is invalid; allowed: a finite float"),
        (["--label-smoothing", "1.5"], "--label-smoothing '1.5': invalid value; allowed: a float"),
        (["--experts", "x"], "--experts 'x': invalid value; allowed: an integer >= 1"),
        (
            ["--parallel-strategy", "expert_parallel", "--training-mode", "cpu"],
            "--training-mode and --parallel-strategy both set distributed.training_mode",
        ),
        (["--no-compile", "auto"], "--no-compile takes no value"),
        ([], "nothing to train: give --example"),
        (["--example", "digits", "--model", "x:y"], "--example and --model/--data both say"),
        (["--model", "tests.test_cli:nope", "--data", "x:y"], "has no 'nope'"),
    ],
)
def test_bad_command_lines_exit_2_naming_flag_value_and_allowed(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert expected in capsys.readouterr().err


def test_randaugment_without_torchvision_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed")
    argv = [
        "--model",
        "tests.test_cli:tiny_model",
        "--data",
        "tests.test_cli:tiny_data",
        "--randaugment",
    ]
    assert main(argv) == 2
    assert "--randaugment needs torchvision, which is not installed" in capsys.readouterr().err


def test_gpu_modes_that_this_machine_cannot_run_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.device_count() > 1:
        pytest.skip("this machine has the GPUs")
    assert main(["--gpu-mode", "multi_gpu"]) == 2
    assert "--gpu-mode 'multi_gpu': needs torchrun (DDP) or at least 2 CUDA GPUs" in (
        capsys.readouterr().err
    )
    if not torch.cuda.is_available():
        assert main(["--gpu-mode", "single_gpu"]) == 2
        assert "this machine has no CUDA GPU; allowed here: auto, cpu" in capsys.readouterr().err


def test_toml_round_trips_and_flags_override_it(tmp_path: Path) -> None:
    parser = fit_parser()
    argv = [
        "--epochs",
        "3",
        "--amp-dtype",
        "bf16",
        "--distributed-device-ids",
        "0,1",
        "--profile-steps",
        "1,1,2",
        "--activation-checkpointing",
        "Block,Layer",
        "--checkpoint-safe-globals",
        "collections:OrderedDict",
        "--val-every-n-epochs",
        "none",
        "--log-dir",
        str(tmp_path),
    ]
    config = resolve_config(parser.parse(argv), parser)
    assert loads(dumps(config)) == config
    toml = tmp_path / "run.toml"
    toml.write_text(
        '[run]\nmax_epochs = 5\nexperiment_name = "t"\n[precision.scaler]\nhysteresis = 2\n'
    )
    config = resolve_config(parser.parse(["--config", str(toml), "--epochs", "2"]), parser)
    assert (config.run.max_epochs, config.run.experiment_name) == (2, "t")
    assert config.precision.scaler.hysteresis == 2 and config.run.handle_signals


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[run]\nmax_epoch = 3\n", "run.max_epoch=3 is invalid; allowed: a field of run:"),
        ("[run]\nmax_epochs = 0\n", "run.max_epochs=0 is invalid; allowed: an integer >= 1"),
        ("[runs]\nmax_epochs = 3\n", "runs={'max_epochs': 3} is invalid; allowed: a field of"),
        ("[run\n", "not valid TOML"),
    ],
)
def test_bad_toml_exits_2_naming_the_dotted_path(
    text: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text(text)
    assert main(["--example", "digits", "--config", str(toml), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert str(toml) in err and expected in err


def test_print_config_prints_the_resolved_tree(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--example", "digits", "--epochs", "4", "--print-config"]) == 0
    config = loads(capsys.readouterr().out)
    assert config.run.max_epochs == 4 and config.run.experiment_name == "digits"


def test_schedulers_span_the_runs_optimizer_steps() -> None:
    loader = DataLoader(range(100), batch_size=10)  # 10 batches
    assert steps_per_epoch(loader, 3, world_size=1) == 4  # the short last window is a step
    assert steps_per_epoch(loader, 3, world_size=2) == 2  # 50 samples, 5 batches per rank
    config = TrainingConfig().replace({"run.max_epochs": 2, "accumulation.accumulation_steps": 3})
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    factory = scheduler_factory("onecycle", config, loader, world_size=1)
    assert factory is not None
    scheduler = factory(optimizer)
    assert isinstance(scheduler, OneCycleLR) and scheduler.total_steps == 8
    capped = scheduler_factory("cosine", config.replace({"run.max_steps": 5}), loader, 1)
    assert capped is not None and capped(optimizer).T_max == 5  # type: ignore[attr-defined]


def test_fit_trains_a_factory_model_with_the_recipes(tmp_path: Path) -> None:
    outcome = run_fit(
        [
            "--model",
            "tests.test_cli:tiny_model",
            "--model-arg",
            "hidden=8",
            "--data",
            "tests.test_cli:tiny_data",
            "--batch-size",
            "16",
            "--epochs",
            "2",
            "--grad-accum",
            "3",
            "--scheduler",
            "onecycle",
            "--focal-loss",
            "--label-smoothing",
            "0.1",
            "--mixup",
            "0.2",
            "--num-workers",
            "0",
            "--log-dir",
            str(tmp_path),
            "--no-progress",
            "--experiment",
            "tiny",
            "--seed",
            "0",
        ]
    )
    assert outcome.exit_code == 0 and outcome.results is not None
    assert outcome.results.global_step == 2 * 4  # OneCycleLR stepped exactly total_steps
    saved = json.loads((outcome.results.run_dir / "results.json").read_text())
    assert saved["command"][:3] == ["core-train", "--model", "tests.test_cli:tiny_model"]


def test_fit_trains_with_the_step_functions_its_flags_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", "tests.test_cli:tiny_model", "--data", "tests.test_cli:tiny_data"]
    steps = ["--training-step", "tests.test_cli:margin_step"]
    steps += ["--validation-step", "tests.test_cli:scored_step"]
    options = ["--batch-size", "16", "--epochs", "2", "--num-workers", "0", "--seed", "0"]
    options += ["--log-dir", str(tmp_path), "--no-progress", "--no-reports"]
    outcome = run_fit([*argv, *steps, *options])
    assert outcome.exit_code == 0 and outcome.results is not None
    records = [
        json.loads(line)
        for line in (outcome.results.run_dir / "events.jsonl").read_text().splitlines()
    ]
    trained = [r for r in records if r["event"] == "train_step"]
    assert len(trained) == 2 * 10  # 160 samples in batches of 16, two epochs
    assert all(r["logged"]["twice"] == pytest.approx(2 * r["loss"]) for r in trained)
    validated = [r for r in records if r["event"] == "validation"]
    assert len(validated) == 2 and all(0.0 <= r["metrics"]["hits"] <= 1.0 for r in validated)
    # A bad path exits 2 naming its flag, as --model's does; so does a loss flag beside it.
    assert main([*argv, "--training-step", "tests.test_cli:nope"]) == 2
    assert "--training-step 'tests.test_cli:nope': 'tests.test_cli' has no 'nope'" in (
        capsys.readouterr().err
    )
    assert main([*argv, "--validation-step", "tests.test_cli:SLOW"]) == 2
    assert "--validation-step 'tests.test_cli:SLOW': 'tests.test_cli' has no 'SLOW'" in (
        capsys.readouterr().err
    )
    assert main([*argv, *steps, "--focal-loss"]) == 2
    assert (
        "--training-step 'tests.test_cli:margin_step' computes the loss itself, so --focal-loss "
        "cannot reach it; allowed: one of the two. Fix: compute that loss in the step, or drop "
        "--training-step."
    ) in capsys.readouterr().err


def test_load_model_rebuilds_the_model_of_a_fit_checkpoint(tmp_path: Path) -> None:
    outcome = run_fit(
        [
            "--model",
            "tests.test_cli:tiny_model",
            "--model-arg",
            "hidden=8",
            "--data",
            "tests.test_cli:tiny_data",
            "--batch-size",
            "32",
            "--epochs",
            "1",
            "--num-workers",
            "0",
            "--log-dir",
            str(tmp_path),
            "--no-progress",
            "--no-reports",
            "--seed",
            "0",
        ]
    )
    assert outcome.exit_code == 0 and outcome.results is not None
    checkpoint = outcome.results.last_checkpoint
    assert checkpoint is not None
    assert model_factory_of(checkpoint) == Factory("tests.test_cli:tiny_model", hidden=8)
    model = load_model(checkpoint)
    fresh = tiny_model(hidden=8)
    assert type(model) is type(fresh) and model[0].out_features == 8 and not model.training
    saved = torch.load(Path(checkpoint) / "state.pt", weights_only=True)["model"]
    assert saved.keys() == model.state_dict().keys()
    assert all(torch.equal(t, saved[k]) for k, t in model.state_dict().items())
    assert not torch.equal(model[0].weight, fresh[0].weight)  # trained, not the initial weights


def test_model_args_that_checkpoints_cannot_record_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "--model",
        "tests.test_cli:tiny_model",
        "--model-arg",
        "hidden=nan",
        "--data",
        "tests.test_cli:tiny_data",
    ]
    assert main(argv) == 2
    assert "--model-arg 'hidden=nan': not a JSON value; allowed:" in capsys.readouterr().err


def test_info_reports_devices_and_the_recommended_precision(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert len(info["devices"]) == torch.cuda.device_count()
    expected = "fp32" if not torch.cuda.is_available() else info["recommended"]["precision"]
    assert info["recommended"]["precision"] == expected and "available" in info["nvml"]


def test_find_batch_size_prints_the_size_and_trials(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "find-batch-size",
        "--model",
        "tests.test_cli:tiny_model",
        "--input-shape",
        "4,8",
        "--device",
        "cpu",
        "--target-memory-gb",
        "0.0001",
        "--json",
    ]
    assert main(argv) == 0
    search = json.loads(capsys.readouterr().out)
    assert search["batch_size"] >= 1 and search["trials"]
    assert all(t["fits"] for t in search["trials"] if t["batch_size"] <= search["batch_size"])


def test_check_amp_prints_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("core.precision.compatibility")
    code = main(["check-amp", "tests.test_cli:tiny_model", "--device", "cpu", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == (0 if report["compatible"] else 1) and "warnings" in report


@pytest.mark.processes
def test_help_lists_every_seed_switch_and_a_bad_flag_exits_2_from_the_command_line() -> None:
    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "core", *args],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    helped, refused = start("--help"), start("--example", "digits", "--gpu-mode", "tpu")
    (out, err), (_, refusal) = helped.communicate(timeout=120), refused.communicate(timeout=120)
    assert helped.returncode == 0, err
    missing = [flag for flag in SEED_SWITCHES if flag not in out]
    assert missing == []
    assert refused.returncode == 2
    assert "--gpu-mode 'tpu': invalid choice; allowed: auto, cpu, single_gpu, multi_gpu" in refusal


@pytest.mark.plots
@pytest.mark.slow
def test_python_m_core_fits_the_digits_example_and_report_rebuilds_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = [
        sys.executable,
        "-m",
        "core",
        "fit",
        "--example",
        "digits",
        "--epochs",
        "1",
        "--num-workers",
        "0",
        "--no-progress",
        "--no-reports",
        "--log-dir",
        str(tmp_path),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = Path(done.stdout.split("run directory: ")[1].splitlines()[0])
    assert "val_accuracy=" in done.stdout and (run_dir / "results.json").exists()
    assert not (run_dir / "performance_summary.txt").exists()
    assert main(["report", str(run_dir)]) == 0
    printed = capsys.readouterr().out.split()
    assert str(run_dir / "performance_summary.txt") in printed
    assert (run_dir / "performance_summary.txt").read_text().startswith("Performance summary")


def test_the_command_line_page_lists_every_command_and_flag_the_parsers_take() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    start, end = "<!-- cli-reference:start -->\n", "<!-- cli-reference:end -->"
    documented = page.split(start, 1)[1].split(end, 1)[0]
    assert set(PARSERS) == set(_commands())  # every command has its section
    for name, build in PARSERS.items():
        assert f"### `core-train {name}`" in documented
        missing = flags_of(build()) - set(re.findall(r"--[a-z0-9][\w-]*", documented))
        assert missing == set(), f"core-train {name}: flags docs/cli.md does not list"
    assert documented == reference_markdown(), (
        "docs/cli.md differs from the parsers: paste `python -m core.cli.reference` "
        "between its cli-reference markers"
    )


def test_the_checkpoint_metric_and_the_gpu_monitor_have_distinct_flags() -> None:
    parser = fit_parser()
    new = [
        "--checkpoint-monitor",
        "val_accuracy",
        "--checkpoint-mode",
        "max",
        "--no-gpu-monitor",
        "--gpu-monitor-interval-s",
        "0.5",
        "--gpu-monitor-history-size",
        "10",
    ]
    old = [
        "--monitor",
        "val_accuracy",
        "--mode",
        "max",
        "--no-monitor-enabled",
        "--monitor-interval-s",
        "0.5",
        "--monitor-history-size",
        "10",
    ]
    expected = {
        "checkpoint.monitor": "val_accuracy",
        "checkpoint.mode": "max",
        "monitor.enabled": False,
        "monitor.interval_s": 0.5,
        "monitor.history_size": 10,
    }
    assert sets(parser.parse(new)) == sets(fit_parser().parse(old)) == expected
    shown = parser.format_help()
    checkpoint = shown.split("config: checkpoint (CheckpointConfig):")[1].split("\nconfig: ")[0]
    monitor = shown.split("config: monitor (GPUMonitorConfig):")[1].split("\nconfig: ")[0]
    assert "--checkpoint-monitor MONITOR" in checkpoint and "(also spelt --monitor)" in checkpoint
    described, flags = monitor.split("\n\n", 1)
    assert "Not the checkpoint's metric: that is --checkpoint-monitor" in " ".join(
        described.split()
    )
    assert "--gpu-monitor, --no-gpu-monitor" in flags and "--checkpoint-monitor" not in flags


def test_both_spellings_of_one_setting_are_refused_together(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--monitor", "val_loss", "--checkpoint-monitor", "val_loss"]) == 2
    assert "--checkpoint-monitor and --monitor both set checkpoint.monitor" in (
        capsys.readouterr().err
    )


def test_a_stop_says_how_to_resume_where_the_user_is() -> None:
    stopped = SignalReceived(signal.SIGINT, "ckpt/step-1")
    assert str(stopped).endswith("Resume with resume='auto'.")  # Python
    with resume_phrased_for("command line"):
        assert str(stopped).endswith("Resume with --resume auto.")
        crossed = pickle.loads(pickle.dumps(stopped))  # raised in a rank, read here
        assert str(crossed).endswith("Resume with --resume auto.")
    assert str(crossed).endswith("Resume with resume='auto'.")


@pytest.mark.processes
def test_ctrl_c_stops_fit_at_a_checkpoint_and_says_resume_auto(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "core",
        "fit",
        "--model",
        "tests.test_cli:tiny_model",
        "--data",
        "tests.test_cli:slow_data",
        "--batch-size",
        "16",
        "--epochs",
        "500",
        "--no-progress",
        "--no-reports",
        "--log-dir",
        str(tmp_path),
    ]
    fit = subprocess.Popen(
        command, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while not any('"train_step"' in p.read_text() for p in tmp_path.glob("*/*/events.jsonl")):
        if fit.poll() is not None:  # it ended before training: say why
            pytest.fail(fit.communicate()[1][-3000:])
        assert time.monotonic() < deadline
        time.sleep(0.05)
    fit.send_signal(signal.SIGINT)
    _, err = fit.communicate(timeout=120)
    assert fit.returncode == 130, err
    said = err.strip().splitlines()[-1]
    assert said.startswith("core-train: stopped by SIGINT at a step boundary; checkpoint "), err
    assert said.endswith("written. Resume with --resume auto."), err
    assert "resume='auto'" not in err
    checkpoint = Path(said.split("checkpoint ", 1)[1].split(" written")[0])
    assert checkpoint.is_dir()
