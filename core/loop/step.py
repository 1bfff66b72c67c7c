"""One optimizer step, in the kernel the run was built for.

Two kernels, chosen once when the loop is built (:func:`optimizer_step_for`), both ending
in the one post-backward sequence (``core.loop.gradients``):

- :class:`BatchStep`, the plain case: one loader batch per step, one backward, gradients
  synchronised by that backward where there are several ranks (DDP's own), no model terms.
  Forward and loss under the precision's autocast, the loss checked, backward, then the
  update. Nothing is called that would do nothing: no window weights, no sync context, no
  rank vote.
- :class:`WindowStep`, everything else: windows of several batches (accumulation),
  micro-batches (``micro_batch_size``, or halved after an out-of-memory error), each
  micro-batch's loss weighted by its share of the window's samples (or tokens), gradients
  synchronised by the last micro-batch's backward only, ranks voting on out-of-memory
  errors, a model's own loss terms and statistics.

Both take step N-1's readback after step N's backward is queued and before its optimizer
step (``before_step`` of the update), so the host reads N-1 while the device works on N.

CPU-GPU sync points (CUDA):

- Per step, the only one is lagged: ``recorder.settle()`` reads step N-1's scalars back
  while step N's backward is already queued (see ``core.loop.readback``).
- A non-fused optimizer on CUDA costs one more: its stepper reads the skip flag on the host
  (``core.loop.stepper``); fused AdamW, Adam and SGD skip on the device.
- Ranks with unequal shards (a user's sampler) all-reduce the window's sample count each
  step; over gloo the host waits for that collective (not for the GPU).
- After an out-of-memory error only: ``torch.cuda.empty_cache()`` before the retry.
- Ranks agreeing on OOM (``oom_recovery="on"`` under DDP): a 4-byte vote per micro-batch
  on the gloo control group (the host waits for the other ranks, not for the GPU), and the
  gradients averaged after backward (``core.loop.retry``).

Nothing else reads a device value: the loss checks look at tensor metadata, the gradient
norm and clip stay on the device, and batches are copied with ``non_blocking=True``.

An out-of-memory error in a :class:`BatchStep` is recovered by its :class:`WindowStep`: the
micro-batch is halved, the random generators rewound, and the window run again split; from
then on the split windows take the :class:`WindowStep`.
"""

from __future__ import annotations

from core.loop.accumulation import SampleWeights
from core.loop.batch_step import BatchStep
from core.loop.window_step import WindowStep

__all__ = ("BatchStep", "OptimizerStep", "WindowStep", "optimizer_step_for")

OptimizerStep = WindowStep | BatchStep


def optimizer_step_for(windows: WindowStep) -> OptimizerStep:
    """The kernel for the run ``windows`` was built for: :class:`BatchStep` where a step is
    one batch and one backward (no accumulation or split, samples weighting with equal
    windows on every rank, gradients synced by that backward, no model terms), else
    ``windows`` itself."""
    accumulation = windows.accumulation
    plain = (
        accumulation.accumulation_steps == 1
        and accumulation.micro_batch_size is None
        and type(accumulation.loss_weights) is SampleWeights
        and windows.strategy.equal_windows
        and windows.retry.sync_in_backward
        and windows.terms is None
    )
    return BatchStep(windows) if plain else windows
