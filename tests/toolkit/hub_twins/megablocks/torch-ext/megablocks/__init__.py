"""Twin of kernels-community/megablocks's layer that transformers 5.24 maps (README.md beside the package)."""

from . import layers

__all__ = ["layers"]
