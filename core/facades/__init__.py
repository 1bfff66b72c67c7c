"""The public classes under the names the project's five founding documents gave them.

``OptimizedTrainingOptimizer``, ``MixedPrecisionTrainer``, ``MultiGPUTrainer``,
``GradientAccumulation``, seed 000's integrated system and the factory's flat keywords are
thin facades: each maps its documented arguments onto the config tree and hands the work to
the objects underneath (``core.trainer``, ``core.precision``, ``core.distributed``...), which
never import this package. The import paths the documents name (``core.mixed_precision_training``
and its siblings) re-export these modules.
"""
