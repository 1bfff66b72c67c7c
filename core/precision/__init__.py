"""Precision: the objects (FP32, Autocast, ScaledFP16), the on-device loss scaler, and the
policy that resolves a config into one of them and keeps the AMP statistics."""
