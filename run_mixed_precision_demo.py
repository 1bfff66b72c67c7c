"""Seed 002's command, ``python run_mixed_precision_demo.py``, run from the repository's root:
fp32, bf16 and fp16 compared on the device at hand by :mod:`examples.mixed_precision_demo`,
with its flags.

    python run_mixed_precision_demo.py                  # 200 steps per precision
    python run_mixed_precision_demo.py --quick          # a few steps of a tiny model
    python run_mixed_precision_demo.py --out results/amp --device cpu
"""

from __future__ import annotations

from examples.mixed_precision_demo import main

if __name__ == "__main__":
    main()
