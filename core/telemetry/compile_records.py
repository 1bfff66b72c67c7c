"""The records of ``torch.compile`` (see ``core.telemetry.records`` for the schema's rules).

No ``from __future__ import annotations``: checks read annotations.
"""

from typing import Annotated

from core.telemetry.record_common import Common

__all__ = ("Compile", "CompileDecision")


class Compile(Common):
    """Once per compiled target, at its first call (compilation is lazy: the first step)."""

    target: Annotated[str, "what was compiled: 'model' or a block's qualified name"]
    mode: Annotated[str, "torch.compile mode"]
    fullgraph: Annotated[bool, "one graph without breaks was demanded"]
    seconds: Annotated[float, "wall time of the first call: tracing, both graphs, the forward"]
    graph_breaks: Annotated[int, "graph breaks this compilation added"]


class CompileDecision(Common):
    """Once, with compile='auto' on CUDA, after the eager steps it timed (or at the run's end)."""

    step: Annotated[int, "the optimizer step after which it decided"]
    eager_step_s: Annotated[float | None, "measured eager seconds per step (null: none timed)"]
    remaining_steps: Annotated[int, "planned steps left after this one"]
    expected_saving_s: Annotated[float | None, "remaining x eager_step_s x the saving"]
    expected_compile_s: Annotated[float, "the compile time the rule assumes"]
    compile: Annotated[bool, "whether it compiles now"]
    rule: Annotated[str, "the rule, in words"]
    compiled: Annotated[list[str], "what was compiled ('model' or block names); [] if not"]
