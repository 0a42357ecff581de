"""Twin of kernels-community/activation's layers that transformers maps (README.md beside the package)."""

from . import layers

__all__ = ["layers"]
