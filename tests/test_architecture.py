"""The layering of the package, as ARCHITECTURE.md draws it, checked on the import graph.

Every ``import core...`` in every module counts, including those inside functions and under
``TYPE_CHECKING``: an arrow a reader must follow is an arrow.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "core"
IMPORT_PATHS = {
    "core.optimized_training_optimizer",
    "core.mixed_precision_training",
    "core.gradient_accumulation",
    "core.multi_gpu_training",
    "core.gpu_utilization_mixed_precision_system",
}
"""The import paths the founding documents name: each re-exports its module of ``core.facades``."""
FACES = {"core", "core.__main__", *IMPORT_PATHS}
FACE_PACKAGES = ("core.facades", "core.cli")
"""The top of the package: the facades under the founding documents' names, the command line."""
COMPONENTS = (
    "loop",
    "precision",
    "distributed",
    "checkpointing",
    "telemetry",
    "monitoring",
    "hardware",
    "memory",
    "transforms",
    "data",
    "metrics",
    "console",
    "reports",
    "trackers",
    "losses",
    "moe",
    "stopping",
)
FOUNDING_VOCABULARY = re.compile(
    r"\b(?:MixedPrecisionTrainer|MultiGPUTrainer|OptimizedTrainingOptimizer|GradientAccumulation"
    r"|GPUManager|IntegratedGPUTrainingSystem|GPUPerformanceMonitor|MixedPrecisionOptimizer"
    r"|multi_gpu_trainer|create_optimized_training_optimizer|create_multi_gpu_trainer"
    r"|create_mixed_precision_trainer|create_mixed_precision_optimizer)\b"
    r"|\b[Ss]eeds? (?:\d{3}|API|faces?|documents?|names?|alias(?:es)?)\b|\b[Tt]he seeds?(?:'s?)? "
)
"""The founding documents' own classes and the words that point at the documents: the
facades' vocabulary, which the modules beneath them do not use."""
TRAINER_LAYERS = ("state", "assembly", "epochs", "running", "process", "cluster", "job")
"""``core.trainer``'s subpackages, bottom up: each imports only those before it."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports (absolute names)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            for alias in node.names:  # ``from core.loop import epoch`` imports a module
                if f"{node.module}.{alias.name}" in MODULES:
                    yield f"{node.module}.{alias.name}"


GRAPH = {name: {m for m in imports(path) if m.startswith("core")} for name, path in MODULES.items()}


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def is_face(module: str) -> bool:
    return module in FACES or any(in_package(module, p) for p in FACE_PACKAGES)


def arrows(source: str, target: str) -> list[str]:
    return sorted(
        f"{name} -> {imported}"
        for name, targets in GRAPH.items()
        if in_package(name, source)
        for imported in targets
        if in_package(imported, target)
    )


def test_the_graph_is_read_from_every_module() -> None:
    assert len(MODULES) > 60 and "core.trainer.job.orchestrator" in GRAPH
    assert "core.loop.epoch" in GRAPH["core.trainer.assembly.build"]  # the parser sees arrows


def test_the_synchronous_loop_never_imports_anyio() -> None:
    offenders = sorted(
        f"{name} -> {m}"
        for name, path in MODULES.items()
        if in_package(name, "core.loop")
        for m in imports(path)
        if m.split(".")[0] in ("anyio", "trio", "asyncio")
    )
    assert offenders == []


@pytest.mark.parametrize("component", COMPONENTS)
def test_no_component_imports_the_async_shell_or_a_seed_face(component: str) -> None:
    shell = arrows(f"core.{component}", "core.trainer")
    faces = [a for a in arrows(f"core.{component}", "core") if is_face(a.split(" -> ")[1])]
    assert shell + faces == []


def test_only_the_faces_import_the_async_shell() -> None:
    outside = [
        f"{name} -> {m}"
        for name, targets in GRAPH.items()
        if not in_package(name, "core.trainer") and not is_face(name)
        for m in targets
        if in_package(m, "core.trainer")
    ]
    assert outside == []


def test_faces_sit_on_top_no_module_outside_them_imports_one() -> None:
    under = sorted(
        f"{name} -> {m}"
        for name, targets in GRAPH.items()
        if not is_face(name)
        for m in targets
        if is_face(m)
    )
    assert under == []


def package_of(module: str) -> str:
    """The layer a module belongs to: ``core.loop.step`` -> ``core.loop``."""
    return ".".join(module.split(".")[:2])


def test_no_module_beneath_the_facades_speaks_their_vocabulary() -> None:
    speakers = sorted(
        f"{name}:{number}: {match.group(0)}"
        for name, path in MODULES.items()
        if not is_face(name)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if (match := FOUNDING_VOCABULARY.search(line))
        and not line.startswith("FORMER_NAMES = ")  # a module's table of its old names
    )
    assert speakers == []


def test_no_two_layers_point_both_ways() -> None:
    layers = {
        (package_of(name), package_of(m))
        for name, targets in GRAPH.items()
        for m in targets
        if package_of(name) != package_of(m) and m in GRAPH
    }
    both_ways = sorted(f"{a} <-> {b}" for a, b in layers if (b, a) in layers and a < b)
    assert both_ways == []


def test_distribution_does_not_import_monitoring() -> None:
    assert arrows("core.distributed", "core.monitoring") == []


def test_precision_and_distribution_do_not_know_each_other() -> None:
    assert arrows("core.precision", "core.distributed") == []
    assert arrows("core.distributed", "core.precision") == []


def test_the_import_graph_has_no_circle() -> None:
    modules = {
        name: {m for m in targets if m in GRAPH and m != name} for name, targets in GRAPH.items()
    }
    # A package's __init__ re-exporting its own modules is not a circle a reader follows.
    for name, targets in modules.items():
        if MODULES[name].name == "__init__.py":
            modules[name] = {m for m in targets if not in_package(m, name)}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        seen[node] = 1
        for nxt in sorted(modules[node]):
            if seen.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in seen and (cycle := visit(nxt, [*path, node])):
                return cycle
        seen[node] = 2
        return None

    for start in sorted(modules):
        if start not in seen:
            assert visit(start, []) is None


def test_environment_variables_are_read_in_one_place() -> None:
    readers = sorted(
        name
        for name, path in MODULES.items()
        if "os.environ" in path.read_text() or "os.getenv" in path.read_text()
    )
    # core.rng only writes CUBLAS_WORKSPACE_CONFIG (for cuBLAS) when asked to be deterministic;
    # the cluster's connection reads RAY_ADDRESS and sets Ray's preload for a cluster it starts.
    assert readers == [
        "core.distributed.environment",
        "core.distributed.launch",
        "core.rng",
        "core.trainer.cluster.connection",
    ]


def test_the_trainer_subpackages_import_only_those_below_them() -> None:
    layer = {f"core.trainer.{name}": rank for rank, name in enumerate(TRAINER_LAYERS)}
    upward = sorted(
        f"{name} -> {imported}"
        for name, targets in GRAPH.items()
        for imported in targets
        if (source := ".".join(name.split(".")[:3])) in layer
        and (target := ".".join(imported.split(".")[:3])) in layer
        and layer[target] > layer[source]
    )
    assert upward == []
    assert {m for m in MODULES if m.count(".") == 2 and m.startswith("core.trainer.")} == set(layer)


def test_the_top_of_core_holds_only_shared_modules_and_the_documented_import_paths() -> None:
    top = {name for name in MODULES if name.count(".") == 1 and MODULES[name].name != "__init__.py"}
    shared = {
        "core.callbacks",
        "core.checks",
        "core.config",
        "core.errors",
        "core.factory",
        "core.flat_keyword",
    }
    sections = {"core.run_config", "core.ray_config"}  # the config tree's, beside core.config
    lazy = {"core.lazy_exports"}  # what the packages' names loaded on first use share
    assert top - IMPORT_PATHS - shared - lazy == {"core.__main__", "core.rng", *sections}
    for path in IMPORT_PATHS:  # a re-export, nothing more
        assert GRAPH[path] == {path.replace("core.", "core.facades.", 1)}


POST_BACKWARD = {"clip_grad_norm_", "clip_grads_with_norm_", "unscale_", "stepper_for"}
"""Calls only the post-backward sequence makes (``core.loop.step``): a module that makes
one writes a second copy of it."""


def calls_in(path: Path) -> set[str]:
    """The names of the functions and methods ``path`` calls."""
    called = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            target = node.func
            if isinstance(target, ast.Attribute):
                called.add(target.attr)
            elif isinstance(target, ast.Name):
                called.add(target.id)
    return called


def test_the_post_backward_sequence_is_written_once() -> None:
    writers = sorted(
        name
        for name, path in MODULES.items()
        if calls_in(path) & POST_BACKWARD
        and not name.startswith("core.precision")  # the scaler's own unscale_ and its plugin
    )
    assert writers == ["core.loop.step"]


KERNEL = {"OptimizerStep", "GradientUpdate"}
"""The optimizer step and its post-backward sequence: built by ``core.loop.step``'s
factories (``build_step``, ``build_update``) only."""


def test_the_step_is_built_in_one_place() -> None:
    builders = sorted(name for name, path in MODULES.items() if calls_in(path) & KERNEL)
    assert builders == ["core.loop.step"]
