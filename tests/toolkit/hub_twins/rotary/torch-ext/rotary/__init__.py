"""Twin of kernels-community/rotary's transformers layer (README.md beside the package)."""

from . import layers

__all__ = ["layers"]
