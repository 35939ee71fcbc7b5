"""Plain SGD with momentum, the update of ``torch.optim.SGD`` without its first-call cost.

Every ``torch.optim.Optimizer`` method is wrapped so that its first call imports
``torch._dynamo`` (the compiler's tracer: about a second of CPU and 100 MB of modules), although
nothing here is compiled. A short job that needs a few hundred SGD steps, such as SCALE's healing
in a ``scaleflu unlearn`` process, would spend more on that import than on its steps, so it uses
:class:`MomentumSGD`: the same arithmetic, in the same order, as ``torch.optim.SGD`` with
``momentum`` and no dampening, weight decay or Nesterov term (bit-identical parameters after
every step on the CPU, checked by the tests against ``torch.optim.SGD``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch


class _Update:
    """What both optimisers share: ``zero_grad`` drops the gradients (``set_to_none``)."""

    params: list[torch.nn.Parameter]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


class MomentumSGD(_Update):
    """``torch.optim.SGD(params, lr, momentum)``'s update for the parameters given.

    ``zero_grad`` drops the gradients (``set_to_none``); ``step`` updates every parameter that
    has one: ``buf = g`` on its first step, then ``buf = momentum * buf + g``; ``p -= lr * buf``
    (``p -= lr * g`` without momentum).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, momentum: float = 0.0):
        self.params = list(params)
        if lr < 0.0 or momentum < 0.0:
            raise ValueError(f"SGD needs lr >= 0 and momentum >= 0, got {lr} and {momentum}")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self._buf: list[torch.Tensor | None] = [None] * len(self.params)

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            if self.momentum != 0.0:
                buf = self._buf[i]
                if buf is None:
                    buf = self._buf[i] = g.detach().clone()
                else:
                    buf.mul_(self.momentum).add_(g, alpha=1.0)
                g = buf
            p.add_(g, alpha=-self.lr)


_OPTIM_READY = False


def preload_torch_optim() -> float:
    """Pay ``torch.optim``'s first-call import of ``torch._dynamo`` now (once per process);
    return the seconds this call spent. A benchmark calls it before timing methods that use
    ``torch.optim`` (the FedAvg rounds), so that none of them is charged for it."""
    global _OPTIM_READY
    if _OPTIM_READY:
        return 0.0
    t0 = time.perf_counter()
    torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).zero_grad()
    _OPTIM_READY = True
    return time.perf_counter() - t0


class Adam(_Update):
    """``torch.optim.Adam(params, lr, betas, eps)``'s update (no weight decay, no AMSGrad),
    without its first-call import of ``torch._dynamo``; the same operations in the same order
    as torch's single-tensor path, bit for bit (checked against it by the tests)."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ):
        self.params = list(params)
        b1, b2 = (float(b) for b in betas)
        if not lr >= 0.0 or not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0) or not eps > 0.0:
            raise ValueError(
                f"Adam needs lr >= 0, betas in [0, 1), eps > 0; got {lr}, {betas}, {eps}"
            )
        self.lr, self.b1, self.b2, self.eps = float(lr), b1, b2, float(eps)
        self._state: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.params)
        self._steps = [0] * len(self.params)
        # the parameters of the first step, when none had a state yet: their m and v live in
        # one flat buffer each (the per-parameter states are views into them)
        self._flat: tuple[list[int], torch.Tensor, torch.Tensor] | None = None

    def _new_state(self, idx: list[int]) -> None:
        """Zero m and v for the parameters ``idx``: one flat buffer each where they share a
        dtype and a device and none has a state yet (the first step), else one per parameter."""
        ps = [self.params[i] for i in idx]
        if self._flat is None and len({(p.dtype, p.device) for p in ps}) == 1:
            n = sum(p.numel() for p in ps)
            m = torch.zeros(n, dtype=ps[0].dtype, device=ps[0].device)
            v = torch.zeros_like(m)
            off = 0
            for i, p in zip(idx, ps, strict=True):
                k = p.numel()
                self._state[i] = (m[off : off + k].view(p.shape), v[off : off + k].view(p.shape))
                off += k
            self._flat = (list(idx), m, v)
            return
        for i, p in zip(idx, ps, strict=True):
            self._state[i] = (torch.zeros_like(p), torch.zeros_like(p))

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter with a gradient; the parameters at the same step count
        go through each operation together (``torch._foreach_*``: on the CPU the same kernel
        per tensor, without a Python round per tensor and operation). Where they are all the
        parameters of the first step, m and v are updated as one flat tensor each (their
        gradients concatenated): the same arithmetic per entry, bit for bit, in one call per
        operation instead of one per tensor."""
        fresh = [
            i for i, p in enumerate(self.params) if p.grad is not None and self._state[i] is None
        ]
        if fresh:
            self._new_state(fresh)
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(self.params):
            if p.grad is not None:
                self._steps[i] += 1
                groups.setdefault(self._steps[i], []).append(i)
        for t, idx in groups.items():
            ps = [self.params[i] for i in idx]
            gs = [p.grad for p in ps]
            ms = [self._state[i][0] for i in idx]  # type: ignore[index]
            vs = [self._state[i][1] for i in idx]  # type: ignore[index]
            bc1 = 1 - self.b1**t
            bc2 = 1 - self.b2**t
            if self._flat is not None and idx == self._flat[0]:
                _, m, v = self._flat
                g = torch.cat([x.reshape(-1) for x in gs])  # type: ignore[union-attr]
                m.lerp_(g, 1 - self.b1)
                v.mul_(self.b2)
                v.addcmul_(g, g, value=1 - self.b2)
                flat = v.sqrt()
                flat.div_(bc2**0.5)
                flat.add_(self.eps)
                sizes = [p.numel() for p in ps]
                denom = [d.view(p.shape) for d, p in zip(flat.split(sizes), ps, strict=True)]
            else:
                torch._foreach_lerp_(ms, gs, 1 - self.b1)
                torch._foreach_mul_(vs, self.b2)
                torch._foreach_addcmul_(vs, gs, gs, value=1 - self.b2)
                denom = torch._foreach_sqrt(vs)
                torch._foreach_div_(denom, bc2**0.5)
                torch._foreach_add_(denom, self.eps)
            torch._foreach_addcdiv_(ps, ms, denom, value=-(self.lr / bc1))
