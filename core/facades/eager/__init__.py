"""The synchronous per-batch facades of seeds 000 and 002 on the step loop's own parts: one
optimizer step per call (``EagerSteps``), seed 000's four calls (``ManualSteps``), epochs
of them (``EagerEpochs``), and AMP's measured memory saving (``measure_amp_savings``).

Each call reads its values back to the host before it returns: a synchronous facade costs
one device sync per call, by design (the run's step loop reads back one step late)."""
