import torch
from torch import nn


def rotate_copy(x, cos, sin, unsqueeze_dim):
    """A copy of x rotated as rotate_half does over the table's channels (cos.shape[-1], the rest
    passed through), written in place where autograd does not see it, as the real kernel writes:
    the copy's gradient is the unrotated one."""
    out = x.clone()
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    half = min(cos.shape[-1], x.shape[-1]) // 2
    with torch.no_grad():
        view = out.detach()
        x1, x2 = view[..., :half].clone(), view[..., half : 2 * half].clone()
        c, s = cos[..., :half], sin[..., :half]
        view[..., :half] = x1 * c - x2 * s
        view[..., half : 2 * half] = x2 * c + x1 * s
    return out


class apply_rotary_transformers(nn.Module):  # the real layer's name
    """transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim): forward only."""

    can_torch_compile = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return rotate_copy(q, cos, sin, unsqueeze_dim), rotate_copy(k, cos, sin, unsqueeze_dim)
