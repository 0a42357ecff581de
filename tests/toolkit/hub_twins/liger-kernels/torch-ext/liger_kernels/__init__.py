"""Twin of kernels-community/liger-kernels' RMSNorm layer (README.md beside the package)."""

from . import layers

__all__ = ["layers"]
