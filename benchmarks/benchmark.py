"""Benchmarks for `kernels benchmark <checkout or repo id>`.

The runner loads the kernel, and for each benchmark_<workload> method of each
class below: runs setup_<workload>, calls benchmark_<workload> once and compares
`self.out` with what verify_<workload> returns (torch.allclose, atol 1e-2), then
times benchmark_<workload> (host wall clock around a synchronize: the runner's
own measure, not the cold-L2 GPU time of `python -m rope_bwd_triton bench`,
which is what benchmarks/RESULTS.md reports).

Workloads: SOL-ExecBench 019's public suite shape (fp32, 16 heads, head_dim 128)
at S = 128, 1024, 4096, and the real models' head_dim 72 (Qwen3-Omni) and 80
(Qwen2.5-VL) at S = 4096. The references are the eager PyTorch formulas on the
same device (this file runs from a Hub snapshot too, so it needs only torch and
the kernel).
"""

import torch
from kernels.benchmark import Benchmark

HEADS = 16
SHAPES = {
    "s128": (128, 128),
    "s1024": (1024, 128),
    "s4096": (4096, 128),
    "qwen3_omni_d72_s4096": (4096, 72),
    "qwen25_vl_d80_s4096": (4096, 80),
}


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _reference_forward(q, k, cos, sin):
    c, s = cos[:, None, :], sin[:, None, :]
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


class _Rope:
    """Inputs of one workload and the bookkeeping the runner expects: every
    benchmark_ method stores its call's outputs in self.result; `out`, which the
    runner compares with verify_'s result, flattens them into one tensor outside
    the timed call."""

    seed = 0

    @property
    def out(self):
        return torch.cat([t.reshape(-1).float() for t in self.result]) if self.result else None

    @out.setter
    def out(self, value):  # Benchmark.__init__ sets out = None
        self.result = () if value is None else (value,)

    def _inputs(self, workload):
        S, D = SHAPES[workload]
        shape = (S, HEADS, D)
        self.gq, self.gk, self.q, self.k = (torch.randn(shape, device=self.device) for _ in range(4))
        self.embeddings = torch.randn(S, D, device=self.device)
        # cos/sin of the real models' table cat(freqs, freqs), needed by no gradient
        freqs = self.embeddings[:, : D // 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()
        self.grads = (torch.empty_like(self.q), torch.empty_like(self.k), torch.empty_like(self.embeddings))

    def _reference_backward(self, *, table_grad):
        """Autograd of the eager forward: (grad_q, grad_k[, grad_embeddings]) flattened like `out`."""
        q, k = self.q.clone().requires_grad_(), self.k.clone().requires_grad_()
        emb = self.embeddings.clone().requires_grad_(table_grad)
        cos, sin = (emb.cos(), emb.sin()) if table_grad else (self.cos, self.sin)
        leaves = (q, k, emb) if table_grad else (q, k)
        grads = torch.autograd.grad(_reference_forward(q, k, cos, sin), leaves, (self.gq, self.gk))
        return torch.cat([g.reshape(-1) for g in grads])

    def _reference_forward(self):
        outs = _reference_forward(self.q, self.k, self.embeddings.cos(), self.embeddings.sin())
        return torch.cat([o.reshape(-1) for o in outs])


def _workloads(*names):
    """Add setup_/benchmark_/verify_<name> methods (the runner finds workloads by these
    names) that call the class's _run and _verify on the inputs of SHAPES[name]."""

    def add(cls):
        for name in names:
            setattr(cls, f"setup_{name}", lambda self, name=name: self._inputs(name))
            setattr(cls, f"benchmark_{name}", lambda self: self._run())
            setattr(cls, f"verify_{name}", lambda self: self._verify())
        return cls

    return add


@_workloads("s128", "s1024", "s4096", "qwen3_omni_d72_s4096", "qwen25_vl_d80_s4096")
class RopeBackward(_Rope, Benchmark):
    """SOL-ExecBench 019: rope_bwd(grad_q_embed, grad_k_embed, q, k, embeddings) into preallocated outputs."""

    def _run(self):
        self.result = self.kernel.rope_bwd(self.gq, self.gk, self.q, self.k, self.embeddings, out=self.grads)

    def _verify(self):
        return self._reference_backward(table_grad=True)


@_workloads("s1024", "s4096", "qwen3_omni_d72_s4096")
class RopeBackwardQK(_Rope, Benchmark):
    """The backward when cos/sin need no gradient (the real models): only grad_q and grad_k,
    through the op that the autograd backward calls."""

    def _run(self):
        no_grad_table = (None, None, self.cos, self.sin, True, True, False)  # q, k, tables, need_q/k, interleaved
        self.result = self.kernel.ops.rotary_bwd(self.gq, self.gk, *no_grad_table)[:2]

    def _verify(self):
        return self._reference_backward(table_grad=False)


@_workloads("s1024", "s4096")
class RopeForward(_Rope, Benchmark):
    """rope_fwd(q, k, embeddings) -> (q_embed, k_embed)."""

    def _run(self):
        self.result = self.kernel.rope_fwd(self.q, self.k, self.embeddings)

    def _verify(self):
        return self._reference_forward()
