import torch
from torch import nn


def rms_norm(x, weight, eps):
    """Liger's "llama" casting: the statistics and the scaling in float32, the result cast back
    to x's dtype before the weight multiplies it."""
    x32 = x.to(torch.float32)
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class LigerRMSNorm(nn.Module):
    """Over the replaced RMSNorm's weight and variance_epsilon; with a backward (autograd's)."""

    weight: nn.Parameter
    variance_epsilon: float

    def forward(self, hidden_states):
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)
