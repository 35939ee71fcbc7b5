"""Phase I math on constructed inputs: correlation, alignment, KL impact, ranking."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from scaleflu.fl.history import HistoryStore
from scaleflu.fl.models import parameter_groups
from scaleflu.plots import plot_sensitivity
from scaleflu.unlearn.sensitivity import (
    alignment_score,
    class_saliency,
    combine_scores,
    contrastive_contribution,
    forget_saliency,
    historical_sensitivity,
    impact_score,
    kl_divergence,
    paper_sensitivity,
    pearson,
    top_layers,
    weight_distribution,
)

LAYERS = ["a", "b", "c"]


def test_pearson_and_alignment() -> None:
    x = torch.arange(10.0)
    assert pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert pearson(x, -x) == pytest.approx(-1.0)
    assert pearson(x, torch.ones(10)) == 0.0
    assert alignment_score(0.0) == 0.0
    assert alignment_score(0.6) == pytest.approx(-0.5 * math.log(1 - 0.36))
    big = alignment_score(1.0)  # rho^2 clipped below 1: finite
    assert math.isfinite(big) and big > alignment_score(0.999)


def test_kl_zero_when_without_equals_global_and_positive_otherwise() -> None:
    w = torch.randn(50)
    assert impact_score(w, w.clone()) == 0.0
    assert impact_score(w, w * 3.0) == pytest.approx(0.0, abs=1e-9)  # scale-free
    w2 = w.clone()
    w2[:10] = 0.0
    assert impact_score(w, w2) > 0.01
    p = weight_distribution(torch.tensor([0.0, 1.0, -3.0]), eps=1e-8)
    assert float(p.sum()) == pytest.approx(1.0) and float(p.min()) > 0
    assert kl_divergence(p, p) == 0.0


def test_combine_normalises_each_term_by_its_maximum() -> None:
    a = {"a": 2.0, "b": 4.0, "c": 0.0}
    d = {"a": 0.001, "b": 0.0, "c": 0.002}
    raw = combine_scores(LAYERS, a, d, 0.5, normalise=False)
    assert raw["b"] == pytest.approx(2.0)
    norm = combine_scores(LAYERS, a, d, 0.5, normalise=True)
    assert norm == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.5})
    assert top_layers({"a": 1.0, "b": 3.0, "c": 2.0}, LAYERS, 2) == ["b", "c"]
    with pytest.raises(ValueError):
        combine_scores(LAYERS, a, d, 1.5, normalise=True)


def _store(tmp_path: Path, rounds: int = 3) -> HistoryStore:
    """A history where client 0's update dominates layer b; clients 1, 2 add noise."""
    g = torch.Generator().manual_seed(0)
    shapes = {"a": (40,), "b": (40,), "c": (40,)}
    groups = {k: parameter_groups(40, 4) for k in shapes}
    store = HistoryStore(tmp_path, groups=groups)
    state = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    store.record_initial(state)
    sizes = {0: 100, 1: 100, 2: 100}
    for t in range(1, rounds + 1):
        locals_ = {}
        for n in sizes:
            upd = {k: 0.01 * torch.randn(s, generator=g) for k, s in shapes.items()}
            if n == 0:
                upd["b"] = upd["b"] + 1.0 * torch.randn(shapes["b"], generator=g)
            locals_[n] = {k: state[k] + upd[k] for k in shapes}
        new = {k: sum(locals_[n][k] for n in sizes) / 3 for k in shapes}
        store.record_round(t, list(sizes), sizes, locals_, new)
        state = new
    return store


def test_dominated_layer_ranks_first_default(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rep = historical_sensitivity(store, {0: 1.0}, LAYERS, lam=0.5, top_m=1)
    assert rep.top == ["b"]
    assert rep.rho["b"] > 0.9 > rep.rho["a"]
    assert rep.impact["b"] > 10 * rep.impact["a"]
    assert rep.rounds == [1, 2, 3]
    assert set(rep.attribution) == set(LAYERS)
    # A bystander's layers are ranked by its (noise) updates: b is no longer special.
    other = historical_sensitivity(store, {1: 1.0}, LAYERS, lam=0.5, top_m=3)
    assert other.score["b"] < rep.score["b"]
    store.close()


def test_paper_mode_raw_alignment_ranks_nothing(tmp_path: Path) -> None:
    """Paper mode: raw weights correlate ~1 everywhere, so the literal score misranks."""
    store = _store(tmp_path)
    rep = paper_sensitivity(store, [0], LAYERS, lam=0.5, top_m=1)
    assert rep.mode == "paper" and rep.rounds == [3]
    assert min(rep.rho.values()) > 0.9
    # The client that dominates b deviates most there, so its raw rho is *lowest* in b and
    # the raw alignment (about 5 against a KL of about 0.06) buries the KL signal.
    assert rep.rho["b"] < min(rep.rho["a"], rep.rho["c"])
    assert rep.top != ["b"]
    # The KL impact alone (lambda = 0) still finds the layer.
    kl_only = paper_sensitivity(store, [0], LAYERS, lam=0.0, top_m=1)
    assert kl_only.top == ["b"]
    js = rep.to_json()
    assert [r["layer"] for r in js["layers"]] == LAYERS
    store.close()


def test_sensitivity_plot(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rep = historical_sensitivity(store, {0: 1.0}, LAYERS, lam=0.5, top_m=2)
    out = plot_sensitivity(rep, tmp_path / "s.png")
    assert out.stat().st_size > 1000
    store.close()


def test_class_saliency_marks_the_class_specific_weights() -> None:
    # a linear classifier on 4 features; class 1 reads only feature 3, classes 0 and 2 read
    # features 0-2. The saliency of class 1 must sit on the class-1 row, column 3.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(
            torch.tensor([[2.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0], [0.0, 0.5, 2.0, 0.0]])
        )
    x = torch.zeros(30, 4)
    y = torch.tensor([0, 1, 2] * 10)
    x[y == 0, 0] = 1.0
    x[y == 1, 3] = 1.0
    x[y == 2, 2] = 1.0
    x[:, 1] = 0.5
    sal, info = class_saliency(model, x, y, [1], ["weight"], contrast=1.0)
    s = sal["weight"]
    assert info == {"forget_val_samples": 10, "rest_val_samples": 20, "contrast": 1.0}
    assert s.shape == model.weight.shape and bool((s >= 0).all())
    assert torch.argmax(s).item() == 1 * 4 + 3  # row of class 1, feature 3
    assert float(s[:, 0].sum()) == 0.0 and float(s[:, 2].sum()) == 0.0  # other classes' inputs
    assert all(p.grad is None for p in model.parameters())


def test_forget_saliency_marks_the_trigger_weight() -> None:
    # classes 0-2 read features 0-2; the backdoor maps feature 3 (the trigger) to class 0 via
    # w[0, 3]. The forget set (triggered samples labelled 0, as the client holds them) leans on
    # w[0, 3]; the clean retained set does not: the map must peak there.
    model = torch.nn.Linear(4, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(
            torch.tensor([[2.0, 0.0, 0.0, 1.5], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
        )
    fx = torch.zeros(12, 4)
    fx[:, 3] = 1.0
    fx[torch.arange(12), 1 + torch.arange(12) % 2] = 0.6  # true classes 1 and 2, triggered
    fy = torch.zeros(12, dtype=torch.long)
    rx = torch.zeros(30, 4)
    ry = torch.tensor([0, 1, 2] * 10)
    rx[torch.arange(30), ry] = 1.0
    sal, info = forget_saliency(model, fx, fy, rx, ry, ["weight"], contrast=1.0, chunk=5)
    s = sal["weight"]
    assert info == {"forget_samples": 12, "rest_samples": 30, "contrast": 1.0, "stat": "loss"}
    assert s.shape == model.weight.shape and bool((s >= 0).all())
    assert torch.argmax(s).item() == 0 * 4 + 3
    # the vectorised per-sample gradients equal a plain loop
    ref = torch.zeros(3, 4, dtype=torch.float64)
    for i in range(len(fy)):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(fx[i : i + 1]), fy[i : i + 1]).backward()
        ref += (model.weight.detach() * model.weight.grad).abs().double()
    ref_r = torch.zeros(3, 4, dtype=torch.float64)
    for i in range(len(ry)):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(rx[i : i + 1]), ry[i : i + 1]).backward()
        ref_r += (model.weight.detach() * model.weight.grad).abs().double()
    want = (ref / ref.sum() - ref_r / ref_r.sum()).clamp_min(0).float()
    assert torch.allclose(s, want, atol=1e-6)


def test_contrastive_contribution_marks_what_only_the_target_moved(tmp_path: Path) -> None:
    """Every client moves entries 0-9 of every layer; only client 0 also moves b[20:25]."""
    g = torch.Generator().manual_seed(1)
    shapes = {k: (40,) for k in LAYERS}
    store = HistoryStore(tmp_path, groups={k: parameter_groups(40, 4) for k in LAYERS})
    state = {k: torch.zeros(40) for k in LAYERS}
    store.record_initial(state)
    sizes = {0: 100, 1: 100, 2: 100}
    for t in range(1, 4):
        locals_ = {}
        for n in sizes:
            upd = {k: 0.001 * torch.randn(s, generator=g) for k, s in shapes.items()}
            for k in LAYERS:
                upd[k][:10] += 1.0  # the shared task: everyone, the target included
            if n == 0:
                upd["b"][20:25] += 1.0  # what only the target's data teaches
            locals_[n] = {k: state[k] + upd[k] for k in shapes}
        new = {k: sum(locals_[n][k] for n in sizes) / 3 for k in shapes}
        store.record_round(t, list(sizes), sizes, locals_, new)
        state = new
    plain = historical_sensitivity(store, {0: 1.0}, LAYERS, lam=0.5, top_m=3).attribution
    attr, info = contrastive_contribution(store, {0: 1.0}, LAYERS, [1, 2, 3], contrast=1.0)
    assert info["other_updates"] == 6
    # the plain contribution ranks the shared entries as high as the target-only ones ...
    assert float(plain["a"][:10].abs().min()) > 0.5 * float(plain["b"][20:25].abs().min())
    # ... the contrast keeps only the target-only ones
    top = torch.cat([attr[k] for k in LAYERS]).argsort(descending=True)[:5]
    assert sorted(int(i) for i in top) == [60, 61, 62, 63, 64]  # b is the 2nd layer of 40
    target_only = float(attr["b"][20:25].min())
    for k in LAYERS:  # the shared entries (and the noise) are left near zero
        assert float(attr[k][:10].max()) < 1e-2 * target_only
        assert float(attr[k][25:].max()) < 1e-2 * target_only
    store.close()


@pytest.mark.parametrize("name", ["lenet", "mobilenetv3", "resnet18"])
@pytest.mark.parametrize("stat", ["loss", "margin"])
def test_per_sample_gradients_from_one_backward_equal_torch_func(name: str, stat: str) -> None:
    """The saliency's per-sample gradients (layer inputs x output gradients, grouped and
    depthwise convolutions included) equal torch.func's vmap(grad) on every model's layers."""
    from scaleflu.fl.models import build_model, sensitivity_layers
    from scaleflu.unlearn import sensitivity as sens

    torch.manual_seed(0)
    model = build_model(name, num_classes=10, in_channels=1, image_size=28).eval()
    with torch.no_grad():  # BatchNorm's running statistics away from their initial values
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    layers = sensitivity_layers(model)
    layers += [
        f"{n}.bias"
        for n, m in model.named_modules()
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) and m.bias is not None
    ][:2]
    x, y = torch.randn(5, 1, 28, 28), torch.tensor([0, 3, 3, 9, 1])
    hooked = sens.hookable_layers(model, layers)
    assert hooked is not None and set(hooked) == set(layers)
    kinds = {type(m).__name__ for m, _ in hooked.values()}
    assert "Conv2d" in kinds and "Linear" in kinds
    if name == "mobilenetv3":
        assert any(m.groups > 1 for m, _ in hooked.values() if isinstance(m, torch.nn.Conv2d))

    def statistic(out: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
        if stat == "margin":
            hot = (torch.arange(out.shape[-1]) == yy.unsqueeze(-1)).to(out.dtype)
            return (out * hot).sum(-1) - torch.logsumexp(out - 1e9 * hot, dim=-1)
        return torch.nn.functional.cross_entropy(out, yy, reduction="none")

    got = sens._per_sample_weight_grads(model, hooked, statistic, x, y)
    params = {k: v.detach() for k, v in model.named_parameters()}
    want = sens._torch_func_grads(model, params, layers, statistic)(x, y)
    for k in layers:
        assert got[k].shape == (5, *params[k].shape)
        scale = float(want[k].abs().max()) + 1e-12
        assert float((got[k] - want[k]).abs().max()) <= 1e-4 * scale + 1e-7, k
    assert any(float(got[k].abs().max()) > 0 for k in layers)


def test_saliency_falls_back_to_torch_func_for_other_layers() -> None:
    """A layer that is not a Linear or Conv2d weight (a BatchNorm scale) goes through
    torch.func, with the same result as before."""
    from scaleflu.unlearn import sensitivity as sens

    model = torch.nn.Sequential(
        torch.nn.Conv1d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(12, 3)
    ).eval()
    assert sens.hookable_layers(model, ["0.weight", "2.weight"]) is None
    assert sens.hookable_layers(model, ["2.weight"]) is not None
    x, y = torch.randn(6, 1, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    sal, _ = forget_saliency(model, x, y, x[:0], y[:0], ["0.weight", "2.weight"], chunk=4)
    assert set(sal) == {"0.weight", "2.weight"} and float(sal["0.weight"].sum()) > 0


def test_startup_warms_torch_func_once() -> None:
    """The start-up's torch.func warm-up (for saliencies of other layers) runs, once."""
    from scaleflu.unlearn import search

    search._TORCH_FUNC_READY = False
    search.sb3_startup(saliency=True, ppo=False)
    assert search._TORCH_FUNC_READY
    assert search.sb3_startup(saliency=True, ppo=False) == 0.0
