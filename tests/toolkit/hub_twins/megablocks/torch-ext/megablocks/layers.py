from torch import nn


class CPUMegaBlocksMoeMLP(nn.Module):
    """transformers 5.24 maps GPT-OSS's mixture of experts to it on the CPU (inference): the
    experts as the model's own class computes them."""

    can_torch_compile = True
    has_backward = False

    def forward(self, hidden_states):
        return type(self).forward(self, hidden_states)  # kernelize replaces the instance's forward alone
