"""``run.isolation="process"``: the same job in a supervised child process.

In-process tests drive the service side with plain asyncio (the child is real: ``spawn``);
the faults that end processes run tests/fault_jobs.py as the service, with ``--isolation
process``, so that the reliability table's rows hold in process mode too.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch import nn

from core import (
    Callback,
    CheckpointError,
    ConfigError,
    TrainingProcessDied,
    create_optimized_training_optimizer,
)
from core.callbacks import Record, RunInfo
from tests import isolation_parts as parts
from tests.helpers import train_steps, wait_for
from tests.test_checkpoint_safety import small_disk  # noqa: F401 (a fixture)
from tests.test_reliability import ENV, JOB, assert_same_as_uninterrupted, job, records


def build(log_dir: Path, isolation: str, **kwargs: Any) -> Any:
    settings: dict[str, Any] = {
        "model": parts.make_model(),
        "train_loader": parts.make_loader(),
        "val_loader": parts.make_val_loader(),
        "optimizer": parts.sgd,
        "max_epochs": 2,
        "seed": 3,
        "log_dir": log_dir,
        "experiment_name": "iso",
        "progress": False,
        "isolation": isolation,
        **kwargs,
    }
    return create_optimized_training_optimizer(**settings)


class Seen(Callback):
    def __init__(self) -> None:
        self.events: list[str] = []
        self.closed = False

    async def on_record(self, run: RunInfo, record: Record) -> None:
        self.events.append(record["event"])

    async def on_run_closed(self, run: RunInfo) -> None:
        self.closed = True


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    """Bit-equal weights, wherever each model lives: on CUDA a thread-mode run moves the
    caller's model to the GPU, a process-mode run loads the weights into it where it is."""
    ours, theirs = a.state_dict(), b.state_dict()
    return ours.keys() == theirs.keys() and all(
        torch.equal(ours[k].cpu(), theirs[k].cpu()) for k in ours
    )


def gone_or_zombie(pid: int) -> bool:
    """Whether process ``pid`` has exited: reaped, or a zombie not reaped yet (one reaped
    while it is being asked counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_child_trains_the_same_weights_and_the_service_sees_every_record(tmp_path: Path) -> None:
    async def train(isolation: str) -> tuple[Any, Any, Seen, list[str], dict[str, Any]]:
        seen = Seen()
        job = build(tmp_path / isolation, isolation, callbacks=[seen])
        streamed: list[str] = []

        stream = job.events()  # subscribed before train() starts: every record

        async def consume() -> None:
            async for record in stream:
                streamed.append(record["event"])

        consumer = asyncio.create_task(consume())
        results = await job.train()
        await consumer
        return job, results, seen, streamed, await job.evaluate()

    thread, t_results, _, t_streamed, t_eval = asyncio.run(train("thread"))
    process, p_results, seen, streamed, p_eval = asyncio.run(train("process"))
    assert same_weights(process.model, thread.model)  # the service's own model, updated
    assert p_results.global_step == t_results.global_step == process.global_step == 24
    assert p_results.train_loss == t_results.train_loss and p_eval == t_eval
    assert process.epochs_completed == 2 and process.run_dir == p_results.run_dir
    assert Path(process.last_checkpoint).name.startswith("step-000000024-")
    assert process.checkpoints.latest.path == Path(process.last_checkpoint)
    kinds = [e for e in streamed if e not in ("gpu_sample", "monitor_degraded")]
    assert kinds == [e for e in t_streamed if e not in ("gpu_sample", "monitor_degraded")]
    assert seen.events == streamed and seen.events[-1] == "run_end" and seen.closed
    assert gone_or_zombie(process._child.pid)


def test_factories_named_by_strings_build_the_parts_in_each_process(tmp_path: Path) -> None:
    names = {
        "model": "tests.isolation_parts:make_model",
        "train_loader": "tests.isolation_parts:make_loader",
        "val_loader": "tests.isolation_parts:make_val_loader",
        "loss_fn": "torch.nn.functional:cross_entropy",
        "optimizer": "tests.isolation_parts:sgd",
    }
    thread = build(tmp_path / "t", "thread", **names)
    process = build(tmp_path / "p", "process", **names)
    asyncio.run(thread.train())
    asyncio.run(process.train())
    assert same_weights(process.model, thread.model)


@pytest.mark.parametrize(
    ("argument", "value", "match"),
    [
        ("loss_fn", lambda out, y: (out - y).sum(), r"loss_fn=.*not pickle.*Fix: define it at"),
        ("optimizer", "tests.isolation_parts:nothing_here", r"has no 'nothing_here'"),
        ("train_loader", "no_such_package.data:loader", r"cannot be imported"),
        ("train_loader", "a loader", r"'package.module:function'"),
    ],
)
def test_what_cannot_cross_is_refused_at_creation(
    tmp_path: Path, argument: str, value: object, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        build(tmp_path, "process", **{argument: value})


def test_a_local_model_class_is_refused_and_torchrun_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Local(nn.Linear):
        pass

    with pytest.raises(ConfigError, match=r"model=.*does not pickle.*isolation='thread'"):
        build(tmp_path, "process", model=Local(8, 2))
    with pytest.raises(RuntimeError, match=r"isolation='process'.*training process"):
        _ = build(tmp_path, "process").optimizer  # it lives in the training process
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=r"run.isolation='process'.*under torchrun"):
        build(tmp_path, "process")


async def cancel_when(job: Any, form: str, ready: Callable[[], bool]) -> None:
    task = asyncio.ensure_future(job.train())
    while not ready():
        await asyncio.sleep(0.01)
    if form == "task.cancel":
        task.cancel()
        await task
    elif form == "wait_for":
        await asyncio.wait_for(task, 0.01)
    else:
        async with asyncio.timeout(0.01):
            await task


def test_every_native_cancellation_stops_the_child_at_a_boundary_and_resume_is_exact(
    tmp_path: Path,
) -> None:
    # The service learns the child's step from relayed records, which lag it (on a GPU,
    # by the readback's batching): slow batches and small steps leave room to stop early.
    reference = build(tmp_path / "ref", "thread", max_epochs=4)
    asyncio.run(reference.train())
    steps = [0]
    for form in ("task.cancel", "wait_for", "asyncio.timeout"):
        job = build(
            tmp_path, "process", max_epochs=4, resume="auto", train_loader=parts.SlowLoader(0.1)
        )
        target = steps[-1] + random.randint(2, 4)
        reached = functools.partial(lambda j, t: j.global_step >= t, job, target)
        with pytest.raises((asyncio.CancelledError, TimeoutError)):
            asyncio.run(cancel_when(job, form, reached))
        assert job.global_step >= target and job.last_checkpoint is not None
        assert gone_or_zombie(job._child.pid)
        steps.append(job.global_step)
        assert records(tmp_path, "iso")[-1][-1]["status"] == "cancelled"
    done = build(
        tmp_path, "process", max_epochs=4, resume="auto", train_loader=parts.SlowLoader(0.0)
    )
    results = asyncio.run(done.train())
    assert results.global_step == 48 and same_weights(done.model, reference.model)


@pytest.mark.slow
def test_a_loader_s_own_generator_crosses_and_resumes_exactly_in_a_process(
    tmp_path: Path,
) -> None:
    reference = build(tmp_path / "ref", "thread", train_loader=parts.shuffled_by_its_generator())
    asyncio.run(reference.train())
    job = build(tmp_path, "process", train_loader=parts.shuffled_by_its_generator(0.01))
    reached = functools.partial(lambda j: j.global_step >= 14, job)  # 12 steps per epoch
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancel_when(job, "task.cancel", reached))
    assert 14 <= job.global_step < 24
    done = build(tmp_path, "process", resume="auto", train_loader=parts.shuffled_by_its_generator())
    results = asyncio.run(done.train())
    assert results.global_step == 24 and same_weights(done.model, reference.model)
    (resumed,) = [r for r in records(tmp_path, "iso")[-1] if r["event"] == "resumed"]
    assert resumed["data_order"] == "restored"


def test_two_trainings_at_once_each_in_its_own_process(tmp_path: Path) -> None:
    jobs = [build(tmp_path, "process"), build(tmp_path, "process")]

    async def both() -> list[Any]:
        return list(await asyncio.gather(*(j.train() for j in jobs)))

    first, second = asyncio.run(both())
    assert first.last_checkpoint != second.last_checkpoint
    assert same_weights(jobs[0].model, jobs[1].model) and first.train_loss == second.train_loss


def test_a_full_disk_in_the_child_raises_the_same_checkpoint_error(
    tmp_path: Path,
    small_disk: Path,  # noqa: F811
) -> None:
    job = build(tmp_path, "process", model=parts.Big(), checkpoint_dir=small_disk)
    with pytest.raises(CheckpointError, match=r"disk is full.*Fix"):
        asyncio.run(job.train())


def test_a_dead_training_process_names_its_own_checkpoint_never_another_runs(
    tmp_path: Path,
) -> None:
    """A (process mode) and B (another model) share an experiment; B finishes while A
    waits for a batch; A's training process is SIGKILLed: the error names A's newest
    checkpoint, which resume="auto" continues, never B's finished one."""
    waiting = tmp_path / "waiting"
    loader = parts.GatedLoader(waiting, tmp_path / "gate", at=5)
    a = build(tmp_path, "process", checkpoint_every_n_steps=1, train_loader=loader)
    b = build(tmp_path, "thread", model=parts.other_model(), max_epochs=1)

    async def scenario() -> TrainingProcessDied:
        task = asyncio.ensure_future(a.train())
        while not waiting.exists():
            await asyncio.sleep(0.02)
        await b.train()  # its checkpoints are now the newest of the directory
        os.kill(a._child.pid, signal.SIGKILL)
        with pytest.raises(TrainingProcessDied) as died:
            await task
        return died.value

    died = asyncio.run(scenario())
    own = [c for c in b.checkpoints if c.run_id == a.run_dir.name]
    assert own and died.checkpoint == str(max(own, key=lambda c: c.step).path), str(died)
    assert a.last_checkpoint == died.checkpoint
    assert died.finished is None and "resume='auto' continues from it" in str(died)
    assert b.run_dir.name not in str(died)


# The service and its child as real processes (tests/fault_jobs.py) --------------------
def service(out: Path, *args: str, session: bool = False) -> subprocess.Popen[str]:
    command = [sys.executable, str(JOB), "--out", str(out), "--isolation", "process", *args]
    return subprocess.Popen(
        command,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=session,
    )


def child_of(process: subprocess.Popen[str]) -> psutil.Process:
    """The service's training process: a child of its fork server."""
    deadline = time.monotonic() + 60
    while True:
        servers = [
            c
            for c in psutil.Process(process.pid).children()
            if "forkserver" in " ".join(c.cmdline())
        ]
        trainers = [t for server in servers for t in server.children()]
        if trainers:
            return trainers[0]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def resume_is_exact(out: Path, reference: Path) -> None:
    done = job(out, "--isolation", "process", "--resume", "auto")
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same_as_uninterrupted(out, reference)


@pytest.mark.slow
def test_the_child_killed_at_a_random_step_then_resume_is_exact(
    tmp_path: Path, uninterrupted: Path
) -> None:
    killed = job(tmp_path, "--isolation", "process", "--kill-at-call", str(random.randint(3, 30)))
    assert killed.returncode == 3, killed.stdout + killed.stderr
    assert "TrainingProcessDied: the training process was killed by SIGKILL" in killed.stdout
    assert "resume='auto' continues from it" in killed.stdout
    resume_is_exact(tmp_path, uninterrupted)


@pytest.mark.slow
def test_a_service_killed_by_sigkill_leaves_a_child_that_checkpoints_then_resume_is_exact(
    tmp_path: Path, uninterrupted: Path
) -> None:
    process = service(tmp_path, "--slow-s", "0.02")
    trainer = child_of(process)
    wait_for(lambda: train_steps(tmp_path) >= 4, process)
    process.kill()  # kill -9 of the service: its child sees the pipe close
    process.wait(timeout=10)
    trainer.wait(timeout=30)
    (run,) = records(tmp_path / "logs")
    assert run[-1]["event"] == "run_end" and run[-1]["status"] == "cancelled"
    # The stop checkpoint is at the last step (a step that had one already keeps it).
    saved = [r["step"] for r in run if r["event"] == "checkpoint"]
    assert saved and saved[-1] == max(r["step"] for r in run if r["event"] == "train_step")
    resume_is_exact(tmp_path, uninterrupted)


@pytest.mark.slow
def test_ctrl_c_to_the_service_under_asyncio_run_then_resume_is_exact(
    tmp_path: Path, uninterrupted: Path
) -> None:
    process = service(tmp_path, "--runner", "asyncio", "--slow-s", "0.02", session=True)
    wait_for(lambda: train_steps(tmp_path) >= 3, process)
    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    resume_is_exact(tmp_path, uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "expect"),
    [
        (("--hang-loader-at-batch", "5"), "at a step boundary; checkpoint"),
        (("--hang-at-call", "5", "--hang-rank", "0", "--stop-grace-s", "2"), "did not reach"),
    ],
)
def test_sigterm_to_the_service_stops_a_child_whose_loader_or_step_hangs(
    tmp_path: Path, fault: tuple[str, ...], expect: str
) -> None:
    process = service(tmp_path, *fault)
    marker = "loader_hung" if "--hang-loader-at-batch" in fault else "hanging.rank0"
    wait_for((tmp_path / marker).exists, process)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143 and expect in output, output
    assert time.monotonic() - started < 20


@pytest.mark.slow
def test_a_child_that_exits_on_its_own_is_reported_with_its_exit_code(tmp_path: Path) -> None:
    done = job(tmp_path, "--isolation", "process", "--exit-at-call", "5", "--exit-rank", "0")
    assert done.returncode == 3
    assert "the training process exited with code 1 before its run ended" in done.stdout


def run_program(tmp_path: Path, source: str, how: str) -> subprocess.CompletedProcess[str]:
    """``source`` run as a script file, under ``python -c``, or from standard input."""
    script = tmp_path / "program.py"
    script.write_text(source)
    command = {"file": [str(script)], "-c": ["-c", source], "stdin": ["-"]}[how]
    return subprocess.run(
        [sys.executable, *command],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        input=source if how == "stdin" else None,
    )


PROGRAM = (
    "import asyncio\nfrom tests import isolation_parts as p\n"
    "from core import create_optimized_training_optimizer as c\n"
)


@pytest.mark.processes
def test_a_script_without_a_main_guard_gets_one_clear_error(tmp_path: Path) -> None:
    done = run_program(
        tmp_path,
        PROGRAM + "job = c(model=p.make_model(), train_loader=p.make_loader(), "
        f"log_dir={str(tmp_path)!r}, isolation='process', progress=False)\n"
        "asyncio.run(job.train())\n",
        "file",
    )
    assert done.returncode != 0, done.stderr[-2000:]
    # One message: what happened, that nothing was trained or saved, the fix; nothing about
    # a run that ended or a resume, which cannot help here.
    said = done.stderr.strip().splitlines()[-1]
    assert said == (
        "core.errors.MainNotGuarded: the training process exited at once (code 86): it imports"
        " this program's main module, and the program creates its run when imported, so nothing"
        " was trained and no checkpoint was written; the service is unharmed. Fix: start the run"
        ' under `if __name__ == "__main__":`.'
    ), done.stderr[-2000:]
    assert done.stderr.count("Traceback") == 1 and "bootstrapping" not in done.stderr


@pytest.mark.processes
@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_model_class_defined_in_an_unimportable_main_is_refused_at_creation(
    tmp_path: Path, how: str
) -> None:
    source = PROGRAM + (
        "import torch\nclass Net(torch.nn.Linear):\n    pass\n"
        "if __name__ == '__main__':\n"
        "    c(model=Net(8, 2), train_loader=p.make_loader(), isolation='process')\n"
    )
    done = run_program(tmp_path, source, how)
    assert done.returncode == 1
    assert re.search(
        r"ConfigError: model=Net\(.*\) cannot cross .* it needs Net, defined in __main__, which "
        r"that process cannot import .* Fix: move Net into a module",
        done.stderr,
    ), done.stderr


def test_a_training_process_killed_before_its_run_opens_says_so(tmp_path: Path) -> None:
    job = build(tmp_path, "process", model="tests.isolation_parts:killed_while_building")
    with pytest.raises(
        TrainingProcessDied,
        match=r"killed by SIGKILL before its run opened, "
        r"while it built the model and data \(the OOM killer",
    ):
        asyncio.run(job.train())


def test_a_damaged_checkpoint_is_skipped_and_said_so_through_the_relay(tmp_path: Path) -> None:
    first = build(tmp_path, "process", checkpoint_every_n_steps=4)
    asyncio.run(first.train())
    newest = Path(first.last_checkpoint)
    (newest / "state.pt").write_bytes((newest / "state.pt").read_bytes()[:100])
    again = build(tmp_path, "process", resume="auto", max_epochs=3)
    stream = again.events()
    relayed: list[dict[str, Any]] = []

    async def train() -> Any:
        async def consume() -> None:
            async for record in stream:
                relayed.append(record)

        consumer = asyncio.create_task(consume())
        results = await again.train()
        await consumer
        return results

    results = asyncio.run(train())
    invalid = [r for r in relayed if r.get("kind") == "checkpoint_invalid"]
    assert invalid and invalid[0]["path"] == str(newest)
    resumed = next(r for r in relayed if r["event"] == "resumed")
    assert resumed["path"] != str(newest) and resumed["step"] == 20
    assert results.global_step == 36


@pytest.mark.slow
def test_a_repeated_signal_to_the_service_still_leaves_the_stop_checkpoint(
    tmp_path: Path, uninterrupted: Path
) -> None:
    process = service(tmp_path, "--pause-at-call", "5")  # both come while step 5 runs
    wait_for((tmp_path / "paused").exists, process)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143 and "Traceback" not in output, output
    resume_is_exact(tmp_path, uninterrupted)


@pytest.mark.slow
def test_a_frozen_child_is_killed_once_it_is_silent_for_the_stop_grace(tmp_path: Path) -> None:
    process = service(tmp_path, "--freeze-at-call", "5", "--stop-grace-s", "1")
    wait_for((tmp_path / "frozen").exists, process)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 3, output
    assert "killed by SIGKILL after it sent nothing for stop_grace_s (1 s)" in output
    assert "the last good checkpoint is" in output and time.monotonic() - started < 15


# The fork server dies (killed, or picked by the OOM killer) while its child trains -----
def fork_server_of(process: subprocess.Popen[str]) -> psutil.Process:
    trainer = child_of(process)
    server = trainer.parent()
    assert server is not None and "forkserver" in " ".join(server.cmdline())
    return server


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "then", "code", "expect"),
    [
        (("--slow-s", "0.05"), "sigterm", 143, "at a step boundary; checkpoint"),
        (
            ("--freeze-at-call", "8", "--stop-grace-s", "1"),
            "sigterm",
            3,
            "killed by SIGKILL after it sent nothing for stop_grace_s (1 s)",
        ),
        (("--slow-s", "0.05"), "sigkill", 3, "the training process was killed by SIGKILL before"),
    ],
)
def test_a_dead_fork_server_changes_nothing_the_service_sees(
    tmp_path: Path, fault: tuple[str, ...], then: str, code: int, expect: str
) -> None:
    process = service(tmp_path, *fault)
    trainer = child_of(process)
    wait_for(lambda: train_steps(tmp_path) >= 4, process)
    fork_server_of(process).kill()
    time.sleep(0.3)  # its pipe to the service closes: the child must not look dead
    assert trainer.is_running()
    if "--freeze-at-call" in fault:
        wait_for((tmp_path / "frozen").exists, process)
    if then == "sigterm":
        process.send_signal(signal.SIGTERM)
    else:
        trainer.kill()
    output, _ = process.communicate(timeout=60)
    assert process.returncode == code and expect in output, output
    assert "exited with code 255" not in output
    assert not psutil.pid_exists(trainer.pid)  # reaped, not left a zombie of the service


@pytest.mark.slow
def test_a_kill_while_handing_the_weights_back_says_what_resume_will_do(tmp_path: Path) -> None:
    killed = job(tmp_path, "--isolation", "process", "--kill-at-handback")
    assert killed.returncode == 3, killed.stdout + killed.stderr
    message = killed.stdout
    assert "killed by SIGKILL while it handed the trained weights back; " in message
    assert "the run had finished (it completed max_epochs (3 of 3 epochs))" in message
    assert "resume='auto' would start a new run" in message
    final = re.search(r"its last checkpoint (\S+) holds the trained weights", message)
    assert final and Path(final.group(1)).name.startswith("step-000000036-")
    assert not list((tmp_path / "logs").rglob("final_weights/.*"))  # nothing left unswept
    again = job(tmp_path, "--isolation", "process", "--resume", "auto")
    assert again.returncode == 0, again.stdout + again.stderr
    fresh = [r for run in records(tmp_path / "logs") for r in run if r["event"] == "fresh_start"]
    assert fresh and fresh[-1]["reason"] == "finished"
