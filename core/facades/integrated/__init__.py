"""Seed 000's integrated GPU system, as components over the existing parts: ``GPUConfig``
and its place in the config tree, the seed's ``GPUManager`` and ``GPUPerformanceMonitor``,
``setup_training`` (device settings and the batch-size search), and seed 004's monitored
distribution. The facade, ``core.facades.gpu_utilization_mixed_precision_system``, adds training."""
