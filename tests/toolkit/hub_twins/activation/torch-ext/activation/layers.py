from torch import nn
from torch.nn import functional


class Silu(nn.Module):
    """transformers maps it for inference only: no backward."""

    can_torch_compile = True
    has_backward = False

    def forward(self, x):
        return functional.silu(x)


class GeluTanh(nn.Module):
    """The tanh approximation of GELU; inference only, as Silu."""

    can_torch_compile = True
    has_backward = False

    def forward(self, x):
        return functional.gelu(x, approximate="tanh")
