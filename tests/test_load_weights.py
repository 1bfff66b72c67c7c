"""load_weights: a run's checkpoint, verified, into a fresh model (weights only)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.data import DataLoader

from core import CheckpointError, IncompatibleCheckpointError, create_optimized_training_optimizer
from core.checkpointing.store import CheckpointStore
from core.checkpointing.weights import LoadedWeights, load_weights
from core.distributed.config import MultiGPUConfig
from core.errors import UnsafeCheckpointError
from core.transforms.activation_checkpointing import is_checkpointed
from tests.helpers import make_classification, make_model


def blocks_model(seed: int = 0) -> nn.Module:
    """Two repeated composite blocks: what activation checkpointing picks by default."""
    torch.manual_seed(seed)
    block = lambda: nn.Sequential(nn.Linear(16, 16), nn.Tanh())  # noqa: E731
    return nn.Sequential(nn.Linear(8, 16), block(), block(), nn.Linear(16, 2))


def train(log_dir: Path, model: nn.Module, **settings: Any) -> Any:
    run = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(make_classification(64), batch_size=16),
        max_epochs=1,
        log_dir=log_dir,
        **settings,
    )
    anyio.run(run.train)
    return run


def assert_same_model(loaded: nn.Module, trained: nn.Module) -> None:
    ours, theirs = loaded.state_dict(), trained.state_dict()
    assert list(ours) == list(theirs)
    for name, value in ours.items():
        assert torch.equal(value, theirs[name]), name
    x = make_classification(8, seed=3).tensors[0]
    assert torch.equal(loaded.eval()(x), trained.eval()(x))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return train(tmp_path_factory.mktemp("logs"), make_model())


def test_a_trained_run_loads_into_a_fresh_model(trained: Any) -> None:
    fresh = make_model(seed=1)
    assert not torch.equal(fresh[0].weight, trained.model[0].weight)
    loaded = load_weights(trained.last_checkpoint, fresh)
    assert loaded == LoadedWeights(path=Path(trained.last_checkpoint), step=4, epoch=1)
    assert_same_model(fresh, trained.model)


def test_an_altered_byte_fails_verification_before_anything_loads(
    trained: Any, tmp_path: Path
) -> None:
    source = Path(trained.last_checkpoint)
    copy = tmp_path / source.name
    copy.mkdir()
    for file in source.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    data = bytearray((copy / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / "state.pt").write_bytes(bytes(data))
    fresh = make_model(seed=1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"state\.pt has sha256 .* the manifest says"):
        load_weights(copy, fresh)
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())


def test_a_path_that_is_not_a_checkpoint_says_what_one_looks_like(trained: Any) -> None:
    checkpoints = Path(trained.last_checkpoint).parent
    with pytest.raises(
        CheckpointError,
        match=r"is not a checkpoint: a checkpoint directory "
        r"\(step-000000123-<run_id>/.*holds manifest\.json, state\.pt.*Fix: pass "
        r"one of its step-\.\.\. directories",
    ):
        load_weights(checkpoints, make_model())
    with pytest.raises(CheckpointError, match=r"is not a checkpoint"):
        load_weights(Path(trained.last_checkpoint) / "state.pt", make_model())


def test_a_different_model_names_the_first_difference(trained: Any) -> None:
    wider = make_model(hidden=32, seed=1)
    before = wider[2].weight.clone()
    with pytest.raises(
        IncompatibleCheckpointError,
        match=r"differs at '0\.weight' \(checkpoint shape \[16, 8\], model shape \[32, 8\]\)\. "
        r"Fix: .* strict=False",
    ):
        load_weights(trained.last_checkpoint, wider)
    assert torch.equal(wider[2].weight, before)  # nothing loaded
    deeper = nn.Sequential(*make_model(seed=1), nn.Linear(2, 2))
    with pytest.raises(IncompatibleCheckpointError, match=r"'3\.weight' \(checkpoint absent"):
        load_weights(trained.last_checkpoint, deeper)


def test_strict_false_loads_what_matches_and_reports_the_rest(trained: Any) -> None:
    other = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3), nn.Linear(3, 3))
    loaded = load_weights(trained.last_checkpoint, other, strict=False)
    assert loaded.missing_keys == ("2.weight", "2.bias", "3.weight", "3.bias")
    assert loaded.unexpected_keys == ("2.weight", "2.bias")
    assert torch.equal(other[0].weight, trained.model[0].weight)
    assert not torch.equal(other[2].weight[:2], trained.model[2].weight)


def test_pickled_code_in_state_pt_is_refused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last_n=1)
    staging = store.stage(1)
    store.write_state(staging, {"model": make_model().state_dict(), "extra": Path("x")})
    path = store.commit(staging, 1, {"epoch": 0, "reason": "step"})
    with pytest.raises(UnsafeCheckpointError, match="refused to load"):
        load_weights(path, make_model())
    assert load_weights(path, make_model(), safe_globals=[type(Path("x"))]).step == 1


def wrapped_names(kind: str, model: nn.Module) -> dict[str, torch.Tensor]:
    if kind == "compile":
        return torch.compile(model, backend="eager").state_dict()  # lazy: nothing compiles
    if kind == "data_parallel":
        return nn.DataParallel(model).state_dict()
    model[1] = checkpoint_wrapper(model[1])  # its state_dict() hides the prefix; names do not
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    ("kind", "prefix"),
    [
        ("compile", "_orig_mod."),
        ("data_parallel", "module."),
        ("checkpoint_wrapper", "1._checkpoint_wrapped_module."),
    ],
)
def test_wrapper_prefixes_map_onto_the_plain_names(tmp_path: Path, kind: str, prefix: str) -> None:
    source = blocks_model(seed=2)
    expected = {k: v.clone() for k, v in source.state_dict().items()}
    saved = wrapped_names(kind, source)
    assert any(name.startswith(prefix) for name in saved)
    store = CheckpointStore(tmp_path, keep_last_n=1)
    staging = store.stage(7)
    store.write_state(staging, {"model": saved})
    path = store.commit(staging, 7, {"epoch": 2, "reason": "epoch"})
    plain = blocks_model(seed=3)
    assert load_weights(path, plain).epoch == 2
    assert all(torch.equal(v, expected[k]) for k, v in plain.state_dict().items())


def test_a_model_trained_with_activation_checkpointing_loads_into_a_plain_one(
    tmp_path: Path,
) -> None:
    run = train(tmp_path, blocks_model(), activation_checkpointing=True)
    assert is_checkpointed(run.model[1]) and is_checkpointed(run.model[2])
    plain = blocks_model(seed=1)
    load_weights(run.last_checkpoint, plain)
    assert_same_model(plain, run.model)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_fsdp2_checkpoint_loads_without_a_process_group(tmp_path: Path) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        config = MultiGPUConfig(
            training_mode="fsdp",
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            init_method=f"tcp://127.0.0.1:{_free_port()}",  # unused: the group exists
        )
        run = train(tmp_path, make_model(), multi_gpu_config=config)
        trained = {k: v.full_tensor() for k, v in run.model.state_dict().items()}
    finally:
        dist.destroy_process_group()
    path = Path(run.last_checkpoint)
    assert (path / "sharded" / ".metadata").is_file() and "model" not in torch.load(
        path / "state.pt", weights_only=True
    )
    fresh = make_model(seed=1)
    assert load_weights(path, fresh) == LoadedWeights(path=path, step=4, epoch=1)
    assert list(fresh.state_dict()) == list(trained)
    assert all(torch.equal(v, trained[k]) for k, v in fresh.state_dict().items())
    assert not torch.equal(trained["0.weight"], make_model()[0].weight)  # it did train
