"""The device: memory counters, CUDA settings (TF32, cudnn, memory fraction), OpenMP threads."""
