"""The documentation's programs run as written (a fresh interpreter in a temp dir), and every
```python block of README.md and docs/ is run by some test.

To register the python blocks of a new page or section:

1. Write the test that runs them, here or in a new ``tests/test_docs_<page>.py``::

       from tests.doc_blocks import python_blocks, run_program

       def test_the_lr_finder_example_runs_as_written(tmp_path: Path) -> None:
           (program,) = python_blocks("docs/training.md", "## Learning-rate finder")
           done = run_program(program, tmp_path)
           assert done.returncode == 0, done.stderr[-3000:]
           ...  # and what a user would see: files written, numbers printed

2. Claim the section in ``CLAIMS`` below, naming that test::

       ("docs/training.md", "## Learning-rate finder"): (
           "test_the_lr_finder_example_runs_as_written"
       ),

A heading is its whole line, hashes included; a claim covers the section's subsections too.
``test_every_python_block_is_claimed_by_a_test`` fails for a python block no claim covers,
for a claim whose heading is gone or holds no python block, and for a claim naming a test
that neither this module nor a ``tests/test_docs*.py`` module defines. Blocks in other
languages (bash, toml, json) are not run; ``test_the_commands_shown_exist`` checks the
install lines, make targets, modules and scripts that bash blocks name.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, code_blocks, doc_files, parse, python_blocks, run_program
from tests.helpers import eventually

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# (file, heading) -> the test that runs that section's python blocks.
CLAIMS: dict[tuple[str, str], str] = {
    ("README.md", "## Quick start"): "test_the_quick_start_runs_as_written",
    ("docs/index.md", "## Quick start"): "test_the_quick_start_runs_as_written",
    ("README.md", "## Inside an async program"): "test_the_async_program_runs_as_written",
    ("docs/getting-started.md", "## Inside an async program"): (
        "test_the_async_program_runs_as_written"
    ),
    ("docs/getting-started.md", "## A first program"): "test_the_first_program_runs_as_written",
    ("docs/training.md", "## Train, reload, predict"): "test_train_reload_predict_runs_as_written",
    ("docs/memory-and-speed.md", "## Outside a run"): (
        "test_the_memory_and_speed_example_runs_as_written"
    ),
    ("docs/distributed.md", "## Choosing the mode"): (
        "test_the_several_gpus_example_runs_as_written"
    ),
    ("docs/experts.md", "## The MoE layer"): "test_the_mixture_of_experts_example_runs_as_written",
    ("docs/logging-and-trackers.md", "## Trackers"): "test_the_trackers_example_runs_as_written",
    ("docs/services.md", "## One API, two modes"): (
        "test_the_service_example_trains_in_a_child_process_as_written"
    ),
    (
        "docs/ray.md",
        "## A run on the cluster",
    ): "test_the_ray_example_trains_on_the_cluster_as_written",
    ("docs/checkpoints-and-reliability.md", "## Keeping checkpoints"): (
        "test_the_keeping_checkpoints_example_runs_as_written"
    ),
    ("docs/training.md", "## Smoke runs"): "test_the_smoke_runs_example_runs_as_written",
    ("docs/logging-and-trackers.md", "## Weights & Biases"): (
        "test_the_wandb_example_writes_an_offline_run_as_written"
    ),
    ("docs/memory-and-speed.md", "## bf16 on a CPU"): "test_the_bf16_on_a_cpu_example_runs",
    ("docs/training.md", "## Learning-rate finder"): "test_the_lr_finder_example_runs_as_written",
    ("docs/distributed.md", "## Launching several processes without torchrun"): (
        "test_the_devices_example_starts_two_ranks_as_written"
    ),
    ("docs/founding-api.md", "## The per-batch and synchronous facades"): (
        "test_the_seed_api_example_runs_as_written"
    ),
    ("docs/lightning.md", "## Your own step"): "test_the_step_function_example_runs_as_written",
    ("docs/lightning.md", "## Callbacks that steer"): (
        "test_the_steering_callback_example_runs_as_written"
    ),
    ("docs/lightning.md", "## Early stopping and plateau schedules"): (
        "test_the_early_stopping_and_plateau_example_runs_as_written"
    ),
}


def test_every_python_block_is_claimed_by_a_test() -> None:
    defined: set[str] = set()
    for module in [ROOT / "tests" / "test_readme.py", *(ROOT / "tests").glob("test_docs*.py")]:
        tree = ast.parse(module.read_text())
        defined |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {test for test in CLAIMS.values() if test not in defined} == set()
    for file, heading in CLAIMS:
        assert python_blocks(file, heading), f"{file} {heading!r} holds no python block"
    unclaimed = [
        f"{block.file}:{block.line} under {block.headings[-1:]}"
        for file in doc_files()
        for block in code_blocks(file)
        if block.language == "python" and not any((file, h) in CLAIMS for h in block.headings)
    ]
    assert unclaimed == [], "python blocks no test runs; register them in CLAIMS"


def copies(*sections: tuple[str, str]) -> str:
    """The one python block that each of ``sections`` shows, the same in every one."""
    programs = {file: python_blocks(file, heading) for file, heading in sections}
    first = next(iter(programs.values()))
    assert len(first) == 1, programs
    assert all(program == first for program in programs.values()), "the copies differ"
    return first[0]


@pytest.mark.processes
def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    """As written, again, then after an edit of the learning rate, in one directory: each
    time it trains (resume="auto" continues only an unfinished, compatible run)."""
    program = copies(("README.md", "## Quick start"), ("docs/index.md", "## Quick start"))
    assert "async with OptimizedTrainingOptimizer(" in program
    assert 'resume="auto"' in program and "save_best=True" in program
    assert "learning_rate=1e-3" in program
    edited = program.replace("learning_rate=1e-3", "learning_rate=3e-3")
    outputs = []
    for version in (program, program, edited):
        done = run_program(version, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "logs" in done.stdout and "step-" in done.stdout  # the best checkpoint
        assert "completed" in done.stderr  # the end summary
        outputs.append(done.stderr)
    run_dirs = sorted({p.parent for p in (tmp_path / "logs").glob("quickstart/*/events.jsonl")})
    assert len(run_dirs) == 3
    for run_dir in run_dirs:  # every run trained its 3 epochs from step 1
        steps = [r["step"] for r in _records(run_dir) if r["event"] == "train_step"]
        assert steps[0] == 1 and steps[-1] == 48, (run_dir, steps[:3], steps[-3:])
    assert "new run" not in outputs[0]
    assert "new run" in outputs[1] and "completed max_epochs (3 of 3 epochs)" in outputs[1]
    assert "new run" in outputs[2] and "learning_rate (checkpoint 0.001, now 0.003)" in outputs[2]
    for run_dir in run_dirs:
        eventually(run_dir / "performance_summary.txt")  # the reports, in the background


@pytest.mark.processes
def test_the_keeping_checkpoints_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/checkpoints-and-reliability.md", "## Keeping checkpoints")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    kept, loaded = done.stdout.splitlines()[-2:]
    reasons = [reason for _, reason in ast.literal_eval(kept)]
    assert 2 <= len(reasons) <= 3 and reasons.count("best") >= 1, kept
    assert loaded.split()[0] == "64"  # rebuilt by the recorded factory
    link = tmp_path / "logs" / "experiment" / "checkpoints" / "last"
    assert link.is_symlink()


@pytest.mark.processes
def test_the_smoke_runs_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/training.md", "## Smoke runs")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["1 1 False", "4 2"], done.stdout


@pytest.mark.processes
def test_the_wandb_example_writes_an_offline_run_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/logging-and-trackers.md", "## Weights & Biases")
    done = run_program(program, tmp_path)  # HOME is tmp_path: no credentials, no network
    assert done.returncode == 0, done.stderr[-3000:]
    mode, path = done.stdout.split()[-2:]
    assert mode == "offline" and "offline-run-" in path
    assert list((tmp_path / path).glob("run-*.wandb")), path


@pytest.mark.processes
def test_the_bf16_on_a_cpu_example_runs(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/memory-and-speed.md", "## bf16 on a CPU")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    auto, native, *note = done.stdout.splitlines()[-1].split()  # after the bf16 warning
    assert auto == "fp32" and native in ("True", "False", "None")
    assert (note == ["None"]) == (native != "False"), note  # a note only where it is emulated


@pytest.mark.processes
def test_the_lr_finder_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/training.md", "## Learning-rate finder")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    suggestion, reason = done.stdout.strip().splitlines()[-1].split(": ", 1)
    assert 1e-7 <= float(suggestion) <= 1.0 and "smoothed loss" in reason, done.stdout


@pytest.mark.distributed
def test_the_devices_example_starts_two_ranks_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks(
        "docs/distributed.md", "## Launching several processes without torchrun"
    )
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy, ranks = done.stdout.strip().splitlines()[-2:]
    assert accuracy.startswith("val_accuracy=") and "after 24 steps" in accuracy, done.stdout
    assert ranks.startswith("2 ranks"), done.stdout


def _records(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.processes
def test_the_first_program_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/getting-started.md", "## A first program")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = {p.parent for p in (tmp_path / "logs").glob("quickstart/*/events.jsonl")}
    assert "logs" in done.stdout and "step-" in done.stdout  # the best checkpoint
    eventually(run_dir / "performance_summary.txt")


@pytest.mark.processes
def test_the_async_program_runs_as_written(tmp_path: Path) -> None:
    program = copies(
        ("README.md", "## Inside an async program"),
        ("docs/getting-started.md", "## Inside an async program"),
    )
    assert "create_optimized_training_optimizer(" in program
    assert program.index("run.events()") < program.index("run.train()")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    epochs = [" ".join(line.split()[:2]) for line in done.stdout.splitlines()[:-1]]
    # one line per epoch_end, from the stream, numbered as the console numbers them
    assert epochs == ["epoch 1/3", "epoch 2/3", "epoch 3/3"], done.stdout
    console = next(line for line in done.stderr.splitlines() if line.startswith("epoch "))
    assert console.startswith("epoch 1/3"), done.stderr  # the console's count, the same
    (run_dir,) = {p.parent for p in (tmp_path / "logs").glob("*/*/events.jsonl")}
    eventually(run_dir / "performance_summary.txt")


@pytest.mark.processes
def test_the_memory_and_speed_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/memory-and-speed.md", "## Outside a run")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    batch_size = int(done.stdout.split()[0])
    assert 32 <= batch_size < 4096  # the budget binds


@pytest.mark.processes
def test_train_reload_predict_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/training.md", "## Train, reload, predict")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    best = re.search(r"best val_top1 ([0-9.]+)", done.stdout)
    reloaded = re.search(r"test accuracy ([0-9.]+)", done.stdout)
    assert best and reloaded and float(reloaded[1]) > 0.7, done.stdout
    inspected = re.search(
        r"^(cpu|single_gpu) \[(.+)\] latest (\d+) best (\d+) (\d+) steps/epoch",
        done.stdout,
        flags=re.M,
    )
    assert inspected, done.stdout
    steps = [int(step) for step in inspected[2].split(", ")]
    assert steps[0] == int(inspected[3]) == 65 and int(inspected[4]) in steps
    assert int(inspected[5]) == 13


@pytest.mark.slow
def test_the_trackers_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/logging-and-trackers.md", "## Trackers")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("metrics.csv", "training_metrics.png", "profile"):
        assert name in done.stdout
    assert (tmp_path / "logs" / "mlflow.db").exists() and list((tmp_path / "runs").rglob("*"))


@pytest.mark.processes
def test_the_seed_api_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/founding-api.md", "## The per-batch and synchronous facades")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    loss = re.search(r"loss ([0-9.]+), accuracy ([0-9.]+), skipped False", done.stdout)
    assert loss and float(loss[2]) > 0.6, done.stdout
    assert "fp16-ready: True" in done.stdout
    assert list((tmp_path / "logs").rglob("events.jsonl"))


@pytest.mark.processes
def test_the_several_gpus_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/distributed.md", "## Choosing the mode")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.processes
def test_the_mixture_of_experts_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/experts.md", "## The MoE layer")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    tokens = re.search(r"\{'moe': \[(\d+), (\d+), (\d+), (\d+)\]\} (\d+) ([0-9.]+)", done.stdout)
    assert tokens, done.stdout
    kept, dropped = sum(int(tokens[i]) for i in range(1, 5)), int(tokens[5])
    assert kept + dropped == 64 * 2  # samples x top_k
    assert float(tokens[6]) >= 1.0


@pytest.mark.processes
def test_the_service_example_trains_in_a_child_process_as_written(tmp_path: Path) -> None:
    (program,) = python_blocks("docs/services.md", "## One API, two modes")
    assert 'isolation="process"' in program and 'if __name__ == "__main__":' in program
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["16", "True"]
    (events,) = (tmp_path / "logs").glob("*/*/events.jsonl")
    start = json.loads(events.read_text().splitlines()[0])
    assert start["event"] == "run_start"
    isolation = start["resolved"]["isolation"]
    assert isolation["crossing"] == isolation["hand_back"] == "shared_memory"
    assert isolation["tensor_bytes"] >= 4 * start["resolved"]["parameters"]
    assert not list((tmp_path / "logs").rglob("final_weights"))  # no checkpoint to hand back


# --- the commands the bash blocks show ---------------------------------------------------

PIP_EXTRAS = re.compile(r"pip install[^\n#]*?-e\s+'?\.\[([a-z,]+)\]'?")
MAKE = re.compile(r"^make (\w[\w-]*)", flags=re.M)
MODULE = re.compile(r"python3? -m ([\w.]+)")
SCRIPT = re.compile(r"(?:python3?|torchrun)[^\n#]*?\s([\w/]+\.(?:py|sh))\b")


def test_the_commands_shown_exist() -> None:
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    problems = []
    for file in doc_files():
        text = (ROOT / file).read_text()
        # 'core[plots]' names a package no index has; from a checkout it is -e '.[plots]'
        problems += [f"{file}: pip install {m}" for m in re.findall(r"'core\[\w+\]'", text)]
        for match in PIP_EXTRAS.finditer(text):
            problems += [f"{file}: no extra {e!r}" for e in match[1].split(",") if e not in extras]
        for block in code_blocks(file):
            if block.language != "bash":
                continue
            problems += [
                f"{file}: no target {t!r}" for t in MAKE.findall(block.code) if t not in targets
            ]
            for module in MODULE.findall(block.code):
                if module.split(".")[0] not in ("core", "examples", "benchmarks"):
                    continue  # venv, pip: not the project's
                path = ROOT / module.replace(".", "/")
                if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()):
                    problems.append(f"{file}: no module {module!r}")
            for script in SCRIPT.findall(block.code):
                if not (ROOT / script).is_file():
                    problems.append(f"{file}: no file {script!r}")
    assert problems == []


def test_every_docs_page_has_one_title_and_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    for file in doc_files()[1:]:
        titles = [h for h in parse(file)[1] if h.startswith("# ")]
        assert len(titles) == 1, (file, titles)
        assert f": {Path(file).relative_to('docs').as_posix()}\n" in nav, file
