"""The public classes under the names the project's five founding documents gave them.

Each facade maps its documented arguments onto the config tree and hands the work to the
objects underneath, which never import this package; the documents' import paths
(``core.mixed_precision_training``...) re-export these modules.
"""
