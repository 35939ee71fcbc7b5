"""SCALE and Retrain end to end on the shared small FashionMNIST run.

Numbers at this scale (seed 0, 50 PPO episodes, measured while writing): Retrain drops the
backdoor success from 0.86 to 0.03 at a test accuracy of 0.85; SCALE default to 0.03 at 0.83.
With 20 or 30 episodes SCALE stopped at 0.23 (the search had not reached the fc1 groups that
carry the trigger), and with the plain contribution attribution at 0.38-0.47: the episode
budget and the contrastive attribution matter here; see docs/scale.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scaleflu.cli import main as scaleflu_main
from scaleflu.fl.run import LoadedRun
from scaleflu.unlearn import RetrainUnlearner, ScaleUnlearner, UnlearnContext, Unlearner

# the spread behind the class request's bounds: this module's run with seeds 0-2, each under
# torch's native (AVX-512), avx2 and default kernels (ATEN_CPU_CAPABILITY), one thread
CLASS_SPREAD = "seeds 0-2 x kernels native, avx2, default"

FAST_SCALE = [
    "scale.ppo.episodes=50",
    "scale.ppo.n_steps=32",
    "scale.ppo.batch_size=16",
    "scale.eval.relearn_max_rounds=2",
]


def _ctx(run: LoadedRun, request: str, mode: str = "default") -> UnlearnContext:
    return UnlearnContext.from_run_dir(
        None, request, mode, None, FAST_SCALE, progress=False, run=run
    )


@pytest.fixture(scope="module")
def client_results(loaded_run: LoadedRun) -> dict:
    ctx = _ctx(loaded_run, "client:2")
    ppo = _ctx(loaded_run, "client:2")
    ppo.cfg["scale"]["search"] = "ppo"  # the paper's PPO search (an ablation of the default)
    ppo.cfg["scale"]["ppo"]["episodes"] = 10
    return {
        "retrain": RetrainUnlearner().run(ctx).to_dict(),
        "scale": ScaleUnlearner().run(ctx).to_dict(),
        "scale_ppo": ScaleUnlearner().run(ppo).to_dict(),
    }


def test_interface() -> None:
    assert isinstance(ScaleUnlearner(), Unlearner)
    assert isinstance(RetrainUnlearner(), Unlearner)


def test_client_unlearning_removes_backdoor(client_results: dict) -> None:
    ret, sc = client_results["retrain"], client_results["scale"]
    assert ret["protocol"] == "backdoor"
    orig_asr = sc["original"]["backdoor_asr"]
    assert orig_asr > 0.5, "the shared run must carry a working backdoor"
    assert ret["metrics"]["backdoor_asr"] < 0.15
    # SCALE removes the backdoor about as well as Retrain (paper mode does not: it stays ~0.9)
    assert sc["metrics"]["backdoor_asr"] <= ret["metrics"]["backdoor_asr"] + 0.10
    # ... while test accuracy stays within a few points of Retrain's: no client trains after
    # the cut, healing by distillation on the server's 128 samples brings it back (measured:
    # 0.68 -> 0.82 on the selection part; test 0.801 against Retrain's 0.852, the model before
    # unlearning 0.834; with a recovery round 0.826); the forgetting step after it may give up
    # to scale.forget_val_tol (0.03) of the selection accuracy for the remembered samples'
    # membership (measured: test 0.801 -> 0.789)
    tol = float(sc["config"]["scale"]["forget_val_tol"])
    assert abs(sc["metrics"]["test_acc"] - ret["metrics"]["test_acc"]) <= 0.06 + tol
    f = sc["details"]["forgetting"]
    kept = f["measured_epochs"].index(f["kept_epoch"])
    assert f["select_acc_trace"][kept] >= f["select_acc_trace"][0] - tol
    h = sc["details"]["healing"]
    assert h["val_acc_after"] >= h["val_acc_before"] + 0.05
    assert sc["details"]["recovery"]["rounds"] == 0
    # the attribution is the targets' updates contrasted with the other participants'
    assert any("contrasted" in n for n in sc["details"]["sensitivity"]["notes"])
    # and costs far less than retraining on the link and in FedAvg rounds (no timing
    # assertion: wall and CPU times on a shared CPU belong in benchmarks/unlearn_bench.py)
    assert sc["cost"]["bytes"] < 0.25 * ret["cost"]["bytes"]
    assert sc["cost"]["fl_rounds"] < ret["cost"]["fl_rounds"]
    # every part of SCALE's time is in its wall time; the SB3 import is reported apart
    for res in (sc, client_results["scale_ppo"]):
        tm = res["details"]["timing"]
        parts = tm["phase1_s"] + tm["ppo_s"] + tm["select_s"] + tm["recovery_s"] + tm["heal_s"]
        parts += tm["forget_s"]  # the calibrated forgetting step
        parts += tm["escalation_s"]  # the class check's larger cuts (none here) and link cost
        assert parts == pytest.approx(res["cost"]["wall_s"], rel=1e-6)
        assert tm["wall_s"] == res["cost"]["wall_s"] and tm["startup_s"] >= 0.0
        assert 0.0 <= tm["ppo_utility_s"] <= tm["ppo_s"] and tm["torch_threads"] >= 1
        assert res["cost"]["cpu_s"] > 0
    # the default search zeroes the budget's top entries at once and heals on the server's
    # validation samples: no PPO step, no utility pass
    assert sc["details"]["theta_from"] == "greedy" and sc["details"]["ppo_steps"] == 0
    assert sc["details"]["zeroed_share"] == pytest.approx(0.05, abs=1e-3)
    assert sc["details"]["healing"]["samples"] > 0


def test_result_schema(client_results: dict) -> None:
    sc = client_results["scale"]
    for key in ("method", "mode", "request", "protocol", "metrics", "original", "cost", "aoi"):
        assert key in sc
    for key in ("ra", "fa", "fr", "test_acc", "mia_loss_auc", "mia_entropy_member_rate"):
        assert sc["metrics"][key] is not None
    assert set(sc["cost"]) >= {"wall_s", "bytes", "link_s", "fl_rounds", "overhead"}
    assert sc["details"]["sensitivity"]["top"]
    assert len(client_results["scale_ppo"]["details"]["episode_returns"]) > 5
    assert sc["aoi"]["sum_s_trace"] and sc["aoi"]["mean_s_all"] >= 0
    json.dumps(sc)


def test_class_unlearning_fa_near_retrain(loaded_run: LoadedRun) -> None:
    ctx = _ctx(loaded_run, "class:7")
    # the utility term scores what must be kept: the class is left out of its validation set
    assert (ctx.val.labels == 7).any() and not (ctx.val_retain.labels == 7).any()
    assert len(ctx.val_retain) == int((ctx.val.labels != 7).sum())
    assert len(ctx.val_forget) == int((ctx.val.labels == 7).sum()) > 0
    assert (ctx.val_forget.labels == 7).all()
    # a class removed from one client only stays in the federation: it stays scored
    one = _ctx(loaded_run, "class:7@1")
    assert torch.equal(one.val_retain.labels, one.val.labels) and len(one.val_forget) == 0
    ret = RetrainUnlearner().run(ctx).to_dict()
    sc = ScaleUnlearner().run(ctx).to_dict()
    assert sc["protocol"] == "class"
    # a class over the whole federation is sparsified by class saliency on the validation set
    assert any("class saliency" in n for n in sc["details"]["sensitivity"]["notes"])
    # ... and its top-M layers are where that saliency is densest, not the history's S_l
    assert any("saliency per parameter" in n for n in sc["details"]["sensitivity"]["notes"])
    # measured over CLASS_SPREAD: class FA before 0.880-0.963, Retrain 0.000, SCALE 0.000-0.066;
    # SCALE's test accuracy 0.012-0.048 below Retrain's
    assert sc["original"]["fa_class_test"] > 0.8
    assert ret["metrics"]["fa_class_test"] <= 0.05
    assert sc["metrics"]["fa_class_test"] <= ret["metrics"]["fa_class_test"] + 0.15
    assert abs(sc["metrics"]["test_acc"] - ret["metrics"]["test_acc"]) <= 0.08


def test_paper_mode_runs_end_to_end(loaded_run: LoadedRun) -> None:
    ctx = _ctx(loaded_run, "client:2", "paper")
    res = ScaleUnlearner().run(ctx).to_dict()
    assert res["method"] == "scale-paper" and res["mode"] == "paper"
    assert res["cost"]["fl_rounds"] == 0  # no recovery rounds in paper mode
    assert res["details"]["sensitivity"]["mode"] == "paper"
    assert res["details"]["zeroed_share"] > 0
    # no step that left the model as it was is paid for (the literal reward paid s anyway)
    steps = res["details"]["rollout"]
    assert steps and all(st["reward"] == 0.0 for st in steps if st["changed"] == 0)


def test_cli_sample_request_writes_outputs(trained_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "u"
    args = ["unlearn", "--run", str(trained_run), "--request", "sample:4:0.2", "--out", str(out)]
    args += ["--no-progress", "--plots"] + [a for s in FAST_SCALE for a in ("--set", s)]
    assert scaleflu_main(args) == 0
    for name in (
        "model.safetensors",
        "result.json",
        "config.yaml",
        "sensitivity.json",
        "sensitivity.png",
    ):
        assert (out / name).is_file(), name
    res = json.loads((out / "result.json").read_text())
    # the search's and the Sum AoI's figures only where they carry information
    assert (out / "ppo_reward.png").exists() == bool(res["details"]["episode_returns"])
    assert (out / "sum_aoi.png").exists() == (len(res["aoi"]["sum_s_trace"]) > 1)
    assert res["protocol"] == "label_flip" and res["request"]["forget_size"] > 0
    assert res["mode"] == "default"


@pytest.mark.parametrize(
    "request_text, message",
    [("client:9", "unknown client"), ("class:12", "outside"), ("bogus:1", "unknown kind")],
)
def test_cli_bad_request_fails_cleanly(
    trained_run: Path, request_text: str, message: str, capfd: pytest.CaptureFixture
) -> None:
    rc = scaleflu_main(["unlearn", "--run", str(trained_run), "--request", request_text])
    assert rc == 2
    assert message in capfd.readouterr().err


def test_cli_rejects_non_scale_settings(trained_run: Path, capfd: pytest.CaptureFixture) -> None:
    args = ["unlearn", "--run", str(trained_run), "--request", "client:2", "--set", "fl.lr=0.5"]
    assert scaleflu_main(args) == 2
    assert "scale.*" in capfd.readouterr().err


def test_cli_erase_deletes_targets_updates_and_later_requests_work(
    trained_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file

    from scaleflu.cli.unlearn import run_unlearn
    from scaleflu.fl.history import HistoryStore

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)  # the shared run stays as it is
    with HistoryStore(run) as h:
        rounds_2 = h.client_rounds(2)
        assert rounds_2 and all(h.has_updates(t) for t in rounds_2)
    out = run_unlearn(
        run, "client:2", out=tmp_path / "u1", overrides=FAST_SCALE, progress=False, erase=True
    )
    res = json.loads((out / "result.json").read_text())
    er = res["erasure"]
    assert er["clients"] == [2] and er["rounds"] == rounds_2 and er["updates"] == len(rounds_2)
    assert er["bytes"] > 0 and er["final_model_replaced"]
    with HistoryStore(run) as h:
        assert h.client_rounds(2) == [] and h.erased_clients() == {2}
        for t in rounds_2:
            assert 2 not in h.data_sizes(t)
            with safe_open(str(h._updates_path(t)), framework="pt") as fh:
                assert not [k for k in fh.keys() if k.startswith("2/")]  # noqa: SIM118
            assert set(h.client_updates(t)) == {0, 1, 3, 4}
        unlearned = load_file(str(out / "model.safetensors"))
        final = h.final_model()
        assert all(torch.equal(final[k], v.float()) for k, v in unlearned.items())
    # a later request on the erased history still runs (paper mode: the CLI warns)
    with caplog.at_level("WARNING"):
        out2 = run_unlearn(
            run,
            "client:4",
            mode="paper",
            out=tmp_path / "u2",
            overrides=FAST_SCALE,
            progress=False,
        )
    assert "not expected to forget" in caplog.text
    res2 = json.loads((out2 / "result.json").read_text())
    assert res2["request"]["targets"] == [4] and res2.get("erasure") is None


def test_cli_measures_on_request_and_caches_the_model_before(
    trained_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`scaleflu unlearn` measures nothing but the method unless asked (--evaluate, --audit);
    the model before's metrics are kept in RUN/cache for the next method on the request."""
    import shutil

    from scaleflu.cli.unlearn import run_unlearn

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    over = ["baselines.finetune.rounds=1"]
    res = json.loads(
        (run_unlearn(run, "client:2", method="finetune", out=tmp_path / "a", overrides=over,
                     progress=False) / "result.json").read_text()
    )  # fmt: skip
    assert res["metrics"] == {} and res["original"] == {} and res["model_path"]
    assert res["config"]["measure"] is False and not (run / "cache").exists()
    assert not (tmp_path / "a" / "sensitivity.png").exists()
    res = json.loads(
        (run_unlearn(run, "client:2", method="finetune", out=tmp_path / "b", overrides=over,
                     progress=False, evaluate=True) / "result.json").read_text()
    )  # fmt: skip
    assert res["metrics"]["test_acc"] is not None and res["metrics"]["mia_ref_auc"] is None
    assert res["metrics"]["relearn_rounds"] is None  # an audit: --audit
    (cached,) = (run / "cache").glob("original-*.json")
    assert json.loads(cached.read_text()) == res["original"]
    with caplog.at_level("INFO"):
        again = json.loads(
            (run_unlearn(run, "client:2", method="retrain", out=tmp_path / "c", progress=False,
                         overrides=["baselines.retrain.rounds=1"], evaluate=True)
             / "result.json").read_text()
        )  # fmt: skip
    assert "original model's metrics from" in caplog.text and again["original"] == res["original"]
    cached.write_text("{not json")  # a damaged cache is measured again, not trusted
    with caplog.at_level("WARNING"):
        run_unlearn(run, "client:2", method="finetune", out=tmp_path / "d", overrides=over,
                    progress=False, evaluate=True)  # fmt: skip
    assert "metrics cache not used" in caplog.text
    assert json.loads(cached.read_text()) == res["original"]


def test_sample_attribution_option(loaded_run: LoadedRun) -> None:
    from scaleflu.config import ConfigError
    from scaleflu.unlearn.sensitivity import phase_one

    def ctx(value: str) -> UnlearnContext:
        over = [*FAST_SCALE, f"scale.sample_attribution={value}"]
        return UnlearnContext.from_run_dir(
            None, "sample:2:0.3", "default", None, over, progress=False, run=loaded_run
        )

    plain = phase_one(ctx("contribution"), "default")
    contrast = phase_one(ctx("contrast"), "default")
    assert not any("contrasted" in n for n in plain.notes)
    assert any("contrasted" in n for n in contrast.notes)
    k = contrast.top[0]
    assert not torch.equal(plain.attribution[k], contrast.attribution[k])
    with pytest.raises(ConfigError, match="sample_attribution"):
        phase_one(ctx("bogus"), "default")


def test_forget_saliency_and_healing(loaded_run: LoadedRun) -> None:
    """The sample request ranks by the forget set's saliency and heals on a disjoint val part."""
    from scaleflu.config import ConfigError
    from scaleflu.unlearn.heal import split_selection_and_heal
    from scaleflu.unlearn.sensitivity import phase_one

    def ctx(*extra: str) -> UnlearnContext:
        over = [*FAST_SCALE, "scale.ppo.episodes=10", *extra]
        return UnlearnContext.from_run_dir(
            None, "sample:2:0.3", "default", None, over, progress=False, run=loaded_run
        )

    c = ctx("scale.sample_attribution=saliency", "scale.heal_epochs=3", "scale.recovery_rounds=0")
    rep = phase_one(c, "default")
    assert any("forget set's own saliency" in n for n in rep.notes)
    assert any("forget-set saliency per parameter" in n for n in rep.notes)
    plain = phase_one(ctx(), "default")
    k = rep.top[0]
    assert not torch.equal(rep.attribution[k], plain.attribution[k])
    select, heal = split_selection_and_heal(c)
    assert heal is not None and len(select) + len(heal) == len(c.val_retain)
    rows = {tuple(r.tolist()) for r in select.inputs().flatten(1)[:, ::7]}
    assert not rows & {tuple(r.tolist()) for r in heal.inputs().flatten(1)[:, ::7]}
    # off: every sample selects
    assert split_selection_and_heal(ctx("scale.heal_epochs=0"))[1] is None
    res = ScaleUnlearner().run(c)
    h = res.details["healing"]
    assert h["epochs"] == 3 and h["samples"] == len(heal)
    assert h["val_acc_after"] != h["val_acc_before"]
    assert res.details["recovery"]["rounds"] == 0 and res.cost["fl_rounds"] == 0
    assert res.details["timing"]["heal_s"] > 0
    for bad, key in (
        ("scale.heal_share=1.5", "heal_share"),
        ("scale.forget_layers=bogus", "forget_layers"),
        ("scale.forget_saliency_samples=0", "forget_saliency_samples"),
    ):
        with pytest.raises(ConfigError, match=key):
            x = ctx("scale.sample_attribution=saliency", "scale.heal_epochs=1", bad)
            phase_one(x, "default")
            split_selection_and_heal(x)


def test_healing_with_dropout_does_not_depend_on_the_process_history(
    loaded_run: LoadedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose training draws from torch's global generator (dropout, as MobileNetV3's
    classifier) heals the same whatever the process drew before, and the caller's generator
    is left as it was (a MobileNetV3 class request once gave another class check in a table's
    process than alone)."""
    import torch.nn.functional as F

    from scaleflu.fl.models import LeNet5
    from scaleflu.unlearn.heal import heal

    class DropLeNet(LeNet5):
        def head(self, x: torch.Tensor) -> torch.Tensor:
            x = F.dropout(F.relu(self.fc1(x)), 0.5, self.training)
            return self.fc3(F.relu(self.fc2(x)))

    over = [*FAST_SCALE, "scale.heal_loss=ce", "scale.heal_epochs=2"]
    ctx = UnlearnContext.from_run_dir(
        None, "client:2", "default", None, over, progress=False, run=loaded_run
    )

    def new_model(state: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):  # its initial weights are replaced anyway
            model = DropLeNet()
        model.load_state_dict(state if state is not None else ctx.original_state())
        return model

    monkeypatch.setattr(ctx, "new_model", new_model)
    theta = ctx.original_state()
    runs = []
    for history in (1, 2):
        torch.manual_seed(history)
        torch.rand(history * 7)  # whatever the process drew before
        before = torch.get_rng_state()
        runs.append(heal(ctx, theta, ctx.val_retain)[0])
        assert torch.equal(torch.get_rng_state(), before)
    assert any(not torch.equal(runs[0][k], theta[k]) for k in theta)
    for k in theta:
        assert torch.equal(runs[0][k], runs[1][k]), k


def test_healing_until_the_accuracy_before_unlearning(
    loaded_run: LoadedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``scale.heal_until: original`` stops the healing at the first epoch whose selection
    accuracy reaches the model before unlearning's and keeps that epoch; ``best`` (the
    default) runs the same seeded epochs on, by patience alone; a bad value is named."""
    from scaleflu.config import ConfigError
    from scaleflu.fl.device import infer
    from scaleflu.unlearn.heal import heal, split_selection_and_heal

    def ctx(until: str, epochs: int = 12) -> UnlearnContext:
        over = [*FAST_SCALE, "scale.heal_loss=ce", "scale.heal_patience=0"]
        over += [f"scale.heal_epochs={epochs}", f"scale.heal_until={until}"]
        return UnlearnContext.from_run_dir(
            None, "client:2", "default", None, over, progress=False, run=loaded_run
        )

    c = ctx("original")
    select, part = split_selection_and_heal(c)
    assert part is not None
    theta = c.original_state()
    before = c.new_model(theta).eval()
    goal = float((infer(before, select.inputs()).argmax(1) == select.labels).float().mean())
    # a cut: nine in ten weights of the first layer zeroed
    k = next(iter(theta))
    mask = torch.ones_like(theta[k], dtype=torch.bool)
    mask.view(-1)[::10] = False
    cut = {**theta, k: torch.where(mask, torch.zeros_like(theta[k]), theta[k])}
    # by patience alone (none here): every epoch, the best kept
    _, full = heal(ctx("best"), cut, part, select)
    t = full["select_acc_trace"]
    assert full["epochs_run"] == 12 and full["original_select_acc"] is None
    assert t[0] < goal, (t, goal)  # the cut took accuracy

    def first(level: float) -> int:
        """The first epoch that improves on every earlier one and reaches ``level`` (else the
        budget: the option changes nothing)."""
        return next((e for e in range(1, 13) if t[e] > max(t[:e]) and t[e] >= level), 12)

    out, info = heal(c, cut, part, select)
    assert info["until"] == "original" and info["original_select_acc"] == pytest.approx(goal)
    assert info["select_acc_trace"] == t[: first(goal) + 1]  # the same seeded epochs
    assert info["epochs_run"] == first(goal)
    # a model before unlearning no better than the cut one: the first epoch that improves on
    # it (the first: 0.24 -> 0.72 of 128 images here) reaches it, and is kept
    monkeypatch.setattr(c, "original_state", lambda: cut)
    out, info = heal(c, cut, part, select)
    stop = first(t[0])
    assert stop < 12 and info["best_epoch"] == info["epochs_run"] == stop, (t, info)
    # ... what it keeps is that epoch's model, as a healing that ran only that far
    upto, _ = heal(ctx("best", stop), cut, part, select)
    assert all(torch.equal(out[n], upto[n]) for n in out)
    with pytest.raises(ConfigError, match="heal_until"):
        heal(ctx("never"), cut, part, select)


def test_distillation_healing(loaded_run: LoadedRun) -> None:
    """Healing by distillation from the model before unlearning on the server's samples."""
    from scaleflu.config import ConfigError
    from scaleflu.unlearn.heal import distill_targets, heal, heal_loss_kind

    def ctx(request: str, *extra: str) -> UnlearnContext:
        over = [*FAST_SCALE, "scale.heal_loss=distill", *extra]
        return UnlearnContext.from_run_dir(
            None, request, "default", None, over, progress=False, run=loaded_run
        )

    cls = ctx("class:7", "scale.recovery_rounds=0")
    teacher = cls.new_model(cls.original_state()).eval()
    x = cls.val_retain.inputs()
    soft = distill_targets(cls, teacher, x, 2.0)
    # a class removed from the whole federation gets no mass from the teacher; the rest is the
    # teacher's softmax at the temperature, renormalised over the other classes
    assert torch.all(soft[:, 7] == 0) and torch.allclose(soft.sum(1), torch.ones(len(x)))
    with torch.no_grad():
        ref = torch.softmax(teacher(x) / 2.0, dim=1)
    keep = [c for c in range(10) if c != 7]
    want = ref[:, keep] / ref[:, keep].sum(1, keepdim=True)
    assert torch.allclose(soft[:, keep], want, atol=1e-6)
    cli = ctx("client:2", "scale.recovery_rounds=0")
    assert torch.allclose(distill_targets(cli, teacher, x), torch.softmax(teacher(x), 1))
    # the model before unlearning is the fixed point of its own distillation (zero gradient)
    theta = cli.original_state()
    same, info = heal(cli, theta, cli.val_retain)
    assert info["epochs_run"] == 30
    for k, v in theta.items():
        assert torch.allclose(same[k], v, atol=1e-5), k
    # ... where the labels' cross-entropy moves it
    ce = ctx("client:2", "scale.heal_loss=ce", "scale.heal_epochs=2")
    moved, _ = heal(ce, theta, ce.val_retain)
    assert any(not torch.allclose(moved[k], v, atol=1e-4) for k, v in theta.items())
    # distill_class: a class removed from the whole federation distils (its class masked), any
    # other request heals with the labels (a teacher that learned D_u would pass it on)
    dc = ctx("client:2", "scale.heal_loss=distill_class", "scale.heal_epochs=2")
    moved_dc, info_dc = heal(dc, theta, dc.val_retain)
    assert info_dc["loss"] == "ce" and all(torch.equal(moved_dc[k], moved[k]) for k in moved)
    assert heal_loss_kind(ctx("class:7", "scale.heal_loss=distill_class")) == "distill"
    assert heal_loss_kind(ctx("sample:2:0.5", "scale.heal_loss=distill_class")) == "ce"
    # end to end without the recovery round: no client trains, healing restores validation
    # accuracy that the cut took, and the class is still forgotten
    res = ScaleUnlearner().run(cls)
    h = res.details["healing"]
    assert res.details["recovery"]["rounds"] == 0 and res.cost["fl_rounds"] == 0
    assert h["val_acc_after"] > h["val_acc_before"]
    assert res.metrics["fa_class_test"] <= 0.15  # measured over CLASS_SPREAD: 0.000-0.066
    mix = ScaleUnlearner().run(ctx("class:7", "scale.recovery_rounds=0", "scale.heal_augment=mix"))
    assert mix.details["healing"]["val_acc_after"] >= mix.details["healing"]["val_acc_before"]
    for bad, key in (
        ("scale.heal_loss=bogus", "heal_loss"),
        ("scale.heal_temperature=0", "heal_temperature"),
    ):
        with pytest.raises(ConfigError, match=key):
            c = ctx("client:2", bad)
            heal(c, theta, c.val_retain)
    for loss in ("ce", "distill_class"):  # a client request heals with ce under both
        with pytest.raises(ConfigError, match="heal_augment"):
            c = ctx("client:2", f"scale.heal_loss={loss}", "scale.heal_augment=mix")
            heal(c, theta, c.val_retain)
    # heal_params: only the cut's entries (or layers) train, everything else stays bit-exact
    c = ctx("client:2", "scale.heal_params=cut", "scale.heal_loss=ce", "scale.heal_epochs=2")
    k = next(iter(theta))
    cut_state = dict(theta)
    mask = torch.zeros_like(theta[k], dtype=torch.bool)
    mask.view(-1)[::3] = True
    cut_state[k] = torch.where(mask, torch.zeros_like(theta[k]), theta[k])
    out, _ = heal(c, cut_state, c.val_retain, None, {k: mask})
    assert torch.equal(out[k][~mask], theta[k][~mask]) and not torch.equal(out[k], cut_state[k])
    for k2, v in theta.items():
        if k2 != k:
            assert torch.equal(out[k2], v), k2
    c = ctx("client:2", "scale.heal_params=layers", "scale.heal_loss=ce", "scale.heal_epochs=2")
    out, _ = heal(c, cut_state, c.val_retain, None, {k: mask})
    assert not torch.equal(out[k][~mask], theta[k][~mask])
    assert all(torch.equal(out[k2], v) for k2, v in theta.items() if k2 != k)
    with pytest.raises(ConfigError, match="heal_params"):
        heal(c, cut_state, c.val_retain)


def test_the_class_images_that_heal(loaded_run: LoadedRun) -> None:
    """scale.heal_class_images (the default): part of the server's validation images of a class
    removed from the whole federation heals, taught the teacher's other classes; the class check
    measures only the rest."""
    from scaleflu.config import ConfigError
    from scaleflu.unlearn.heal import heal, split_class_images

    def ctx(request: str, *extra: str) -> UnlearnContext:
        over = [*FAST_SCALE, "scale.heal_loss=distill", "scale.recovery_rounds=0", *extra]
        return UnlearnContext.from_run_dir(
            None, request, "default", None, over, progress=False, run=loaded_run
        )

    off = ctx("class:7", "scale.heal_class_images=false")
    assert split_class_images(off) == (off.val_forget, None)
    on = ctx("class:7")  # the default
    assert bool(on.scale_cfg.heal_class_images)
    check, part = split_class_images(on)
    assert part is not None and len(check) and len(part)
    # a seeded split of the class's images: disjoint, together all of them
    n = len(on.val_forget)
    assert len(check) + len(part) == n and len(part) == round(0.5 * n)
    key = lambda d: {tuple(x.flatten().tolist()) for x in d.inputs()}  # noqa: E731
    assert key(check) | key(part) == key(on.val_forget) and not key(check) & key(part)
    assert all(int(c) == 7 for c in on.val_forget.labels)
    # from Theta (its own distillation's fixed point) only the class's images move it: the
    # probability it gives them for their class falls
    theta = on.original_state()

    def p7(state: dict) -> float:
        m = on.new_model(state).eval()
        with torch.no_grad():
            return float(torch.softmax(m(part.inputs()), 1)[:, 7].mean())

    healed, info = heal(on, theta, on.val_retain)
    assert info["class_images"] == len(part)
    before, after = p7(theta), p7(healed)
    assert before > 0.5 and after < 0.5 * before, (before, after)
    assert heal(off, theta, off.val_retain)[1]["class_images"] == 0
    # end to end: the check is scored on the other images only, and the class stays forgotten
    res = ScaleUnlearner().run(on)
    assert res.details["healing"]["class_images"] == len(part)
    assert res.details["class_escalation"]["val_images"] == len(check)
    assert res.metrics["fa_class_test"] <= 0.15
    # no label of the class may be taught (healing on the labels: none heals), and a request
    # without a whole class has no images
    ce = ctx("class:7", "scale.heal_loss=ce")
    assert split_class_images(ce) == (ce.val_forget, None) and len(ce.val_forget)
    with pytest.raises(ConfigError, match="heal_share"):
        split_class_images(ctx("class:7", "scale.heal_share=1.5"))
    cli = ctx("client:2", "scale.heal_class_images=true")
    assert split_class_images(cli)[1] is None and not len(cli.val_forget)


def test_independent_retrain_seed(loaded_run: LoadedRun) -> None:
    """``baselines.retrain.seed``: a second, equally valid Retrain (the sweep's noise floor)."""
    from scaleflu.config import ConfigError, load_config
    from scaleflu.unlearn.registry import make_method

    ctx = _ctx(loaded_run, "client:2")
    reference = RetrainUnlearner(rounds=2)
    reference.run(ctx)
    rng_before = torch.random.get_rng_state()
    first = make_method("retrain", ctx.cfg, rounds=2, seed=7)
    res = first.run(ctx)
    # the caller's RNG is left as it was (the fresh init draws in a forked RNG)
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    again = RetrainUnlearner(rounds=2, seed=7)
    again.run(ctx)
    other = RetrainUnlearner(rounds=2, seed=8)
    other.run(ctx)
    key = next(k for k, v in first.state.items() if v.is_floating_point())
    # deterministic for a seed, different from the reference and from another seed
    assert all(torch.equal(first.state[k], again.state[k]) for k in first.state)
    assert not torch.equal(first.state[key], reference.state[key])
    assert not torch.equal(first.state[key], other.state[key])
    assert res.details["seed"] == 7 and res.cost["fl_rounds"] == 2
    # it learned (from a fresh init, not Theta[1]): well above chance on D_r
    assert res.metrics["ra"] > 0.5
    with pytest.raises(ConfigError, match="baselines.retrain.seed"):
        load_config(None, ["baselines.retrain.seed=-1"])


def test_class_check_keeps_its_best_try_when_the_cap_comes_first(
    loaded_run: LoadedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where larger cuts heal back more of the class (MobileNetV3, 2026-11-29: 0.15, 0.07, 0.13,
    0.25, 0.30, 0.34 of its validation images up to the cap), the result is the try with the
    fewest, not the last."""
    import scaleflu.unlearn.scale as scale_mod

    over = [*FAST_SCALE, "scale.budget=0.002", "scale.class_budget_start=0.002"]
    over += ["scale.forget_epochs=0", "scale.class_budget_max=0.00675"]  # 4 tries
    ctx = UnlearnContext.from_run_dir(
        None, "class:7", "default", None, over, progress=False, run=loaded_run
    )
    seen: list[dict[str, torch.Tensor]] = []
    scores = iter([0.15, 0.07, 0.13, 0.25])

    def fake(_ctx: UnlearnContext, state: dict[str, torch.Tensor]) -> float:
        seen.append({k: v.clone() for k, v in state.items()})
        return next(scores)

    monkeypatch.setattr(scale_mod, "class_val_accuracy", fake)
    sc = ScaleUnlearner()
    res = sc.run(ctx)
    esc = res.details["class_escalation"]
    assert [t["class_val_acc"] for t in esc["tries"]] == [0.15, 0.07, 0.13, 0.25]
    assert esc["kept_budget"] == pytest.approx(0.003) == esc["tries"][1]["budget"]
    assert len(seen) == 4 and not all(torch.equal(seen[1][k], seen[3][k]) for k in seen[1])
    for k, v in seen[1].items():  # the second try's model is the result
        assert torch.equal(sc.state[k], v), k


def test_class_check_grows_the_cut_until_the_class_is_gone(loaded_run: LoadedRun) -> None:
    """A class the healed model still shows on the server's validation images of it: the greedy
    cut's budget grows by half from scale.class_budget_start until it does not (or up to
    scale.class_budget_max)."""
    from scaleflu.config import ConfigError
    from scaleflu.unlearn.scale import class_first_budget, class_val_accuracy

    def ctx(request: str, *extra: str) -> UnlearnContext:
        over = [*FAST_SCALE, "scale.budget=0.002", "scale.class_budget_start=0.002"]
        # (the class's own images not healing: they forget it at the first cut)
        over += ["scale.forget_epochs=0", "scale.heal_class_images=false", *extra]
        return UnlearnContext.from_run_dir(
            None, request, "default", None, over, progress=False, run=loaded_run
        )

    # without the check a cut of 0.2 % of the top-M layers leaves the class recognised
    off_ctx = ctx("class:7", "scale.class_budget_max=null")
    plain = ScaleUnlearner()
    off = plain.run(off_ctx)
    assert off.details["class_escalation"] is None
    before = class_val_accuracy(off_ctx, plain.state)
    assert before > 0.5, before
    on_ctx = ctx("class:7")
    on = ScaleUnlearner()
    res = on.run(on_ctx)
    esc = res.details["class_escalation"]
    tries = esc["tries"]
    assert esc["tol"] == 0.02 and esc["val_images"] == len(on_ctx.val_forget) > 0
    # the first try is the cut without the check, bit for bit
    assert tries[0] == {"budget": 0.002, "class_val_acc": pytest.approx(before)}
    budgets = [t["budget"] for t in tries]
    steps = zip(budgets, budgets[1:], strict=False)
    assert all(b2 == pytest.approx(min(1.5 * b1, 0.2)) for b1, b2 in steps)
    # it stops at the first try within the tolerance (or at the cap), and the result is that try
    assert all(t["class_val_acc"] > 0.02 for t in tries[:-1])
    assert tries[-1]["class_val_acc"] <= 0.02 or budgets[-1] == 0.2
    assert class_val_accuracy(on_ctx, on.state) == pytest.approx(tries[-1]["class_val_acc"])
    assert esc["kept_budget"] == budgets[-1]
    assert res.details["zeroed_share"] > off.details["zeroed_share"]
    # the test images of the class (never seen by the server) go the same way
    assert res.metrics["fa_class_test"] < off.metrics["fa_class_test"] - 0.3
    # the tries are SCALE's time: a part of its wall time, as every other part
    tm = res.details["timing"]
    assert 0.0 < tm["escalation_s"] < tm["wall_s"] == res.cost["wall_s"]
    parts = tm["phase1_s"] + tm["ppo_s"] + tm["select_s"] + tm["recovery_s"] + tm["heal_s"]
    parts += tm["escalation_s"] + tm["forget_s"]
    assert parts == pytest.approx(tm["wall_s"], rel=1e-6)
    # a class removed from one client only stays in the federation: no check
    assert ScaleUnlearner().run(ctx("class:7@1")).details["class_escalation"] is None
    with pytest.raises(ConfigError, match="class_forget_tol"):
        ScaleUnlearner().run(ctx("class:7", "scale.class_forget_tol=1.5"))
    # the first budget: scale.class_budget_start, its default below scale.budget; null: the budget
    assert class_first_budget(ctx("class:7", "scale.class_budget_start=null")) == 0.002
    default = UnlearnContext.from_run_dir(
        None, "class:7", "default", None, list(FAST_SCALE), progress=False, run=loaded_run
    )
    assert class_first_budget(default) == 0.033 < float(default.scale_cfg.budget) == 0.05
    with pytest.raises(ConfigError, match="class_budget_start"):
        ScaleUnlearner().run(ctx("class:7", "scale.class_budget_start=0"))
