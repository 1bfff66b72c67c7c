"""Runs placed on a Ray cluster (``run.isolation="ray"``), on the session's local cluster
(``ray_cluster``: a head that runs nothing and worker nodes a test may add or remove).

Plain asyncio, as a service calls it: the same weights and records as thread mode, a warm
second run, every form of cancellation and ``request_stop``, an actor killed then resumed,
a node lost, ranks spread over nodes, a run that never gets its GPU, a run whose service
dies. What needs no cluster (Ray missing, bad settings) is at the end, unmarked."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from core import (
    CheckpointConfig,
    ClusterStartTimeout,
    ConfigError,
    LoggingConfig,
    RayConfig,
    RunConfig,
    TrainingConfig,
    TrainingProcessDied,
)
from core.checkpointing.store import CheckpointStore
from core.trainer.cluster.actors import LEASES, WARM, ActorRequest
from core.trainer.job.orchestrator import TrainingJob
from tests.helpers import eventually, pythonpath
from tests.isolation_parts import (
    SlowLoader,
    make_loader,
    make_model,
    shuffled_by_its_generator,
)

ray_mark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

RAY = RayConfig(num_cpus=1)


def _config(log_dir: Path, *, ray: RayConfig = RAY, **run: Any) -> TrainingConfig:
    settings: dict[str, Any] = {"max_epochs": 2, "seed": 0, "log_dir": log_dir} | run
    return TrainingConfig(
        run=RunConfig(isolation="ray", **settings),
        ray=ray,
        checkpoint=CheckpointConfig(checkpoint_every_n_steps=4, keep_last_n=20),
        logging=LoggingConfig(progress=False),
    )


def _thread(config: TrainingConfig) -> TrainingConfig:
    return config.replace({"run.isolation": "thread"})


async def _train(
    job: TrainingJob, when: Callable[[dict[str, Any]], bool] = bool, act: Callable[[], Any] = list
) -> tuple[list[dict[str, Any]], Any]:
    """Train ``job``, reading every record from ``events()``; ``act()`` once a record
    satisfies ``when``. Returns the records and the outcome (the results, or the exception
    ``train()`` raised)."""
    records: list[dict[str, Any]] = []
    stream = job.events()
    acted = False

    async def read() -> None:
        nonlocal acted
        async for record in stream:
            records.append(record)
            if not acted and when(record):
                acted = True
                act()

    reader = asyncio.create_task(read())
    try:
        outcome: Any = await job.train()
    except BaseException as exc:  # the outcome a test asserts
        outcome = exc
    await asyncio.wait_for(reader, 30)
    return records, outcome


def _steps(records: list[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in records if r["event"] == "train_step"]


def _run_start(records: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in records if r["event"] == "run_start")


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_a_ray_run_trains_as_thread_mode_does_and_a_second_reuses_its_warm_actor(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    here = make_model()
    asyncio.run(TrainingJob(_thread(config), model=here, train_loader=make_loader()).train())

    async def two_runs() -> list[tuple[list[dict[str, Any]], Any, torch.nn.Module]]:
        done = []
        for _ in range(2):
            model = make_model()
            job = TrainingJob(config, model=model, train_loader="tests.isolation_parts:make_loader")
            records, results = await _train(job)
            done.append((records, results, model))
        return done

    (first, results, model), (second, _, again) = asyncio.run(two_runs())
    assert first[-1]["event"] == "run_end" and first[-1]["status"] == "completed"
    assert _steps(first) == list(range(1, results.global_step + 1))  # in order, no gap, no twin
    for trained in (model, again):  # the weights came back into the caller's model
        for mine, theirs in zip(
            trained.state_dict().values(), here.state_dict().values(), strict=True
        ):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    places = [_run_start(records)["resolved"]["isolation"] for records in (first, second)]
    assert places[0]["mode"] == "ray" and places[0]["actor"] == places[1]["actor"]  # kept warm
    assert (results.run_dir / "events.jsonl").is_file()

    # An actor let go (keep_warm=False) exits once its run's reports are written.
    cold = config.replace({"ray.keep_warm": False})
    job = TrainingJob(cold, model=make_model(), train_loader="tests.isolation_parts:make_loader")
    records, results = asyncio.run(_train(job))
    eventually(results.run_dir / "performance_summary.txt")
    actor = _run_start(records)["resolved"]["isolation"]["actor"]
    deadline = time.monotonic() + 60
    while actor in _actor_names() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert actor not in _actor_names()


async def _cancelled(job: TrainingJob, how: str, started: asyncio.Event) -> Any:
    """Cancel ``job.train()`` as ``how`` says once ``started`` is set; the outcome."""
    try:
        if how == "asyncio.wait_for":  # a deadline the run (minutes long) passes as it trains
            await asyncio.to_thread(_cluster_idle)  # the deadline starts with a free worker
            return await asyncio.wait_for(job.train(), 8.0)
        training = asyncio.create_task(job.train())
        await started.wait()
        if how == "stop":
            assert job.request_stop("enough")
            return await training
        if how == "task.cancel":
            training.cancel()
            return await training
        async with asyncio.timeout(0):
            return await training
    except BaseException as exc:  # the outcome the test asserts
        return exc


def _cluster_idle(timeout_s: float = 60.0) -> None:
    """Retire the warm actors and wait until a CPU is free: earlier tests' actors retire
    after their runs have returned (slowly on a loaded machine), and a deadline set while
    they do would time that wait, not the run."""
    import ray

    WARM.release_all()
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < RAY.num_cpus:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.1)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("how", ["task.cancel", "asyncio.wait_for", "asyncio.timeout", "stop"])
def test_a_cancelled_or_stopped_ray_run_writes_its_stop_checkpoint_and_delivers_run_end(
    tmp_path: Path, how: str
) -> None:
    config = _config(tmp_path, max_epochs=200)
    job = TrainingJob(config, model=make_model(), train_loader=SlowLoader(0.02))

    async def run() -> tuple[list[dict[str, Any]], Any]:
        records: list[dict[str, Any]] = []
        started = asyncio.Event()
        stream = job.events()

        async def read() -> None:
            async for record in stream:
                records.append(record)
                started.set() if record["event"] == "train_step" else None

        reader = asyncio.create_task(read())
        outcome = await _cancelled(job, how, started)
        await asyncio.wait_for(reader, 30)
        return records, outcome

    records, outcome = asyncio.run(run())
    end = records[-1]
    assert end["event"] == "run_end", [r["event"] for r in records[-5:]]
    if how == "stop":
        assert end["status"] == "stopped" and end["stop_reason"] == "requested: enough"
    else:
        assert isinstance(outcome, (asyncio.CancelledError, TimeoutError)), outcome
        assert end["status"] == "cancelled"
    last = [r for r in records if r["event"] == "checkpoint"][-1]
    assert last["step"] == _steps(records)[-1]  # written at the step boundary it stopped at
    store = CheckpointStore(config.checkpoint_directory, keep_last_n=20)
    assert store.verifies(Path(last["path"]))


def _actor_names() -> set[str]:
    import ray

    return {actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)}


def _step_of(checkpoint: str) -> int:
    return int(Path(checkpoint).name.split("-")[1])


def _actor_of(records: list[dict[str, Any]]) -> dict[str, Any]:
    isolation: dict[str, Any] = _run_start(records)["resolved"]["isolation"]
    return isolation


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_a_frozen_actor_is_cancelled_then_killed_and_the_cancel_still_propagates(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, max_epochs=200, stop_grace_s=1)
    job = TrainingJob(config, model=make_model(), train_loader=SlowLoader(0.02))
    place: dict[str, Any] = {}

    async def freeze_then_cancel() -> Any:
        training = asyncio.create_task(job.train())
        async for record in job.events():
            if record["event"] == "run_start":
                place.update(record["resolved"]["isolation"])
            if record["event"] == "train_step":
                os.kill(place["pid"], signal.SIGSTOP)  # its event loop says nothing from now
                training.cancel()
                break
        return (await asyncio.gather(training, return_exceptions=True))[0]

    outcome = asyncio.run(freeze_then_cancel())
    assert isinstance(outcome, asyncio.CancelledError), outcome
    deadline = time.monotonic() + 30  # ray.kill is asynchronous: Ray lists it until done
    while place["actor"] in _actor_names() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert place["actor"] not in _actor_names()


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_a_killed_actor_names_its_checkpoint_and_resume_auto_equals_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    import ray

    config = _config(tmp_path / "a", max_epochs=3).replace({"checkpoint.resume": "auto"})
    uninterrupted = make_model()
    loader = shuffled_by_its_generator(0.002)  # restored on resume: its generator is saved
    asyncio.run(TrainingJob(_thread(config), model=uninterrupted, train_loader=loader).train())

    config = config.replace({"run.log_dir": tmp_path / "b"})
    killed: list[dict[str, Any]] = []

    def kill() -> None:
        killed.append(_actor_of(records_seen))
        ray.kill(ray.get_actor(killed[0]["actor"], namespace="core"))

    records_seen: list[dict[str, Any]] = []

    def past_a_checkpoint(record: dict[str, Any]) -> bool:
        records_seen.append(record)
        return record["event"] == "train_step" and record["step"] == 14

    loader = shuffled_by_its_generator(0.002)
    job = TrainingJob(config, model=make_model(), train_loader=loader)
    records, outcome = asyncio.run(_train(job, past_a_checkpoint, kill))
    assert isinstance(outcome, TrainingProcessDied), outcome
    assert outcome.checkpoint is not None and _step_of(outcome.checkpoint) >= 12
    assert CheckpointStore(config.checkpoint_directory, keep_last_n=20).verifies(
        Path(outcome.checkpoint)
    )
    assert "Ray actor" in str(outcome) and outcome.checkpoint in str(outcome)

    resumed = make_model()
    loader = shuffled_by_its_generator(0.002)
    job = TrainingJob(config, model=resumed, train_loader=loader)
    records, _ = asyncio.run(_train(job))
    assert next(r for r in records if r["event"] == "resumed")["path"] == outcome.checkpoint
    for mine, theirs in zip(
        resumed.state_dict().values(), uninterrupted.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(mine, theirs)


@pytest.mark.ray
def test_ranks_spread_over_two_nodes_equal_ranks_on_one_and_a_node_lost_names_the_checkpoint(
    tmp_path: Path, ray_cluster: Any
) -> None:
    ray_cluster.add_node(num_cpus=1)  # a second node for the spread
    gang = RayConfig(num_cpus=1, actors=2, placement_strategy="STRICT_SPREAD")
    config = _config(tmp_path / "spread", ray=gang)
    spread = make_model()
    _, results = asyncio.run(_train(TrainingJob(config, model=spread, train_loader=make_loader())))
    assert results.global_step == 12  # 96 samples, batches of 8, two ranks, two epochs
    packed = make_model()
    one = RayConfig(num_cpus=1, actors=2, placement_strategy="STRICT_PACK")
    config = _config(tmp_path / "packed", ray=one)
    asyncio.run(_train(TrainingJob(config, model=packed, train_loader=make_loader())))
    for mine, theirs in zip(
        spread.state_dict().values(), packed.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(mine, theirs)

    # The spread gang again, rank 1's node lost as it trains: every rank ends, and the run's
    # last good checkpoint is named.
    def lose_rank_1s_node() -> None:
        workers = [n for n in ray_cluster.list_all_nodes() if n is not ray_cluster.head_node]
        (other,) = [n for n in workers if n.node_id != rank_0["node_id"]]
        lost.append(other.node_id)
        ray_cluster.remove_node(other, allow_graceful=False)

    rank_0: dict[str, Any] = {}
    lost: list[str] = []

    def placed_and_past_a_checkpoint(record: dict[str, Any]) -> bool:
        if record["event"] == "run_start":
            rank_0.update(record["resolved"]["isolation"])
        return record["event"] == "train_step" and record["step"] == 6

    config = _config(tmp_path / "lost", ray=gang, max_epochs=50)
    job = TrainingJob(config, model=make_model(), train_loader=SlowLoader(0.02))
    _, outcome = asyncio.run(_train(job, placed_and_past_a_checkpoint, lose_rank_1s_node))
    ray_cluster.add_node(num_cpus=2)  # in place of the node lost (the head runs nothing)
    assert isinstance(outcome, TrainingProcessDied), outcome
    assert "rank 1's Ray actor" in str(outcome)
    assert outcome.checkpoint is not None and _step_of(outcome.checkpoint) >= 4
    assert outcome.checkpoint in str(outcome)
    assert lost and lost[0] not in {n.node_id for n in ray_cluster.list_all_nodes()}


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_a_gpu_asked_of_a_cpu_cluster_is_pending_then_a_clear_error_and_a_cancel_leaves_nothing(
    tmp_path: Path,
) -> None:
    def job(timeout_s: float | None) -> TrainingJob:
        gpu = RayConfig(num_gpus=1, start_timeout_s=timeout_s)
        return TrainingJob(
            _config(tmp_path, ray=gpu), model=make_model(), train_loader=make_loader()
        )

    records, outcome = asyncio.run(_train(job(2.5)))
    assert isinstance(outcome, ClusterStartTimeout), outcome
    assert "1 GPU" in str(outcome) and "no node of the cluster has that much" in str(outcome)
    pending = [r for r in records if r["event"] == "pending"]
    assert (
        pending and pending[0]["asked"]["GPU"] == 1.0 and pending[0]["waiting_for"] == "resources"
    )

    before = _actor_names()
    waiting = job(None)

    async def cancel_while_pending() -> Any:
        training = asyncio.create_task(waiting.train())
        async for record in waiting.events():
            if record["event"] == "pending":
                training.cancel()
        return await asyncio.gather(training, return_exceptions=True)

    (outcome,) = asyncio.run(cancel_while_pending())
    assert isinstance(outcome, asyncio.CancelledError)
    deadline = time.monotonic() + 30  # ray.kill is asynchronous: Ray lists it until done
    while not _actor_names() <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _actor_names() <= before  # the pending actor left Ray's queue
    assert not list(tmp_path.glob("**/.core-shared-*"))  # the storage markers are removed


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_an_object_that_does_not_pickle_is_refused_before_anything_is_placed(
    tmp_path: Path,
) -> None:
    job = TrainingJob(
        _config(tmp_path),
        model=make_model(),
        train_loader=make_loader(),
        loss_fn=lambda o, t: o.sum(),
    )
    with pytest.raises(ConfigError, match=r"loss_fn=.* cannot cross into the run's Ray actor"):
        asyncio.run(job.train())


_SERVICE = """
import asyncio, sys
from core import CheckpointConfig, LoggingConfig, RayConfig, RunConfig, TrainingConfig
from core.trainer.job.orchestrator import TrainingJob
from tests.isolation_parts import SlowLoader, make_model

async def main() -> None:
    config = TrainingConfig(
        run=RunConfig(isolation="ray", max_epochs=500, log_dir=sys.argv[2]),
        ray=RayConfig(address=sys.argv[1], service_lease_s=2, keep_warm=False),
        checkpoint=CheckpointConfig(checkpoint_every_n_steps=1000),
        logging=LoggingConfig(progress=False),
    )
    job = TrainingJob(config, model=make_model(), train_loader=SlowLoader(0.02))
    training = asyncio.create_task(job.train())
    async for record in job.events():
        if record["event"] == "train_step":
            print("training", flush=True)
            break
    await training

if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.mark.ray
def test_a_service_that_shuts_ray_down_is_not_connected_again_by_its_actors_leases(
    ray_cluster: Any,
) -> None:
    """Ray connects again (or starts a cluster of its own) on any call made after
    ``ray.shutdown()``; the thread renewing the leases of a service's actors must stop
    calling once the service has shut Ray down."""
    import ray

    before = _actor_names()
    actor = ActorRequest.of(RAY).create()
    ray.get(actor.ready.remote(), timeout=60)
    (name,) = _actor_names() - before
    LEASES.hold(actor)
    try:
        ray.shutdown()
        time.sleep(2.5)  # two renewals
        assert not ray.is_initialized()
    finally:
        LEASES.drop(actor)
        ray.shutdown()
        ray.init(address=ray_cluster.address, namespace="core", configure_logging=False)
        ray.kill(ray.get_actor(name, namespace=RAY.namespace))


@pytest.mark.ray
@pytest.mark.parametrize("ending", ["ctrl-c", "sigkill"])
def test_a_service_stopped_by_ctrl_c_or_killed_leaves_its_run_s_stop_checkpoint(
    tmp_path: Path, ray_cluster: Any, ending: str
) -> None:
    """Ctrl-C under ``asyncio.run`` cancels ``train()``: the service exits once the stop
    checkpoint is written. A service killed outright renews no lease: its actor stops the
    run at a step boundary with its checkpoint, and exits."""
    before = _actor_names()
    program = tmp_path / "service.py"
    program.write_text(_SERVICE)
    service = subprocess.Popen(
        [sys.executable, str(program), ray_cluster.address, str(tmp_path / "logs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ | {"PYTHONPATH": pythonpath()},
        text=True,
    )
    try:
        assert service.stdout is not None
        while (line := service.stdout.readline()) not in ("training\n", ""):
            pass  # the service's own log lines (a pending record)
        assert line == "training\n"
        its_actor = _actor_names() - before
        service.send_signal(signal.SIGINT if ending == "ctrl-c" else signal.SIGKILL)
        _, errors = service.communicate(timeout=60)
    finally:
        service.kill()
    checkpoints = tmp_path / "logs" / "experiment" / "checkpoints"
    if ending == "ctrl-c":  # written before the service exited
        assert "KeyboardInterrupt" in errors and list(checkpoints.glob("step-*")), errors[-2000:]
    deadline = time.monotonic() + 60
    while not list(checkpoints.glob("step-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    store = CheckpointStore(checkpoints, keep_last_n=20)
    saved = list(checkpoints.glob("step-*"))
    assert len(saved) == 1 and store.verifies(saved[0])  # the stop checkpoint, nothing lost
    assert store.load_state(saved[0])["trainer"]["global_step"] >= 1
    assert its_actor
    while its_actor & _actor_names() and time.monotonic() < deadline:  # and the actor exits
        time.sleep(0.2)
    assert not its_actor & _actor_names()


def test_without_ray_the_setting_is_a_config_error_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'core\[ray\]'"):
        TrainingJob(_config(tmp_path), model=make_model(), train_loader=make_loader())


def test_bad_ray_settings_name_the_field_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"num_gpus=-1 .*a number >= 0"):
        RayConfig(num_gpus=-1)
    with pytest.raises(ConfigError, match=r"address='ray://head:10001'.*address='auto'"):
        RayConfig(address="ray://head:10001")
    with pytest.raises(ConfigError, match="placement_strategy"):
        RayConfig(placement_strategy="EVERYWHERE")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"isolation='cluster' .*'thread', 'process' or 'ray'"):
        TrainingConfig(run=RunConfig(isolation="cluster"))  # type: ignore[arg-type]
