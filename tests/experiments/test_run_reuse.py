"""A trained run is reused when only unlearning settings change, never when training ones do."""

from scaleflu.config import load_config
from scaleflu.experiments.harness import training_view


def test_training_view_ignores_unlearning_settings():
    base = training_view(load_config())
    unlearn_only = load_config(
        overrides=["scale.ppo.episodes=5", "scale.lambda=0.9", "baselines.fused.rank=4"]
    )
    assert training_view(unlearn_only) == base
    # where and in what passes a run is evaluated (a run saved with the old default of 1000)
    for change in ("fl.eval_batch_size=1000", "fl.device=cpu"):
        assert training_view(load_config(overrides=[change])) == base, change


def test_training_view_sees_what_shapes_the_run():
    base = training_view(load_config())
    for change in ("scale.groups_per_layer=4", "fl.lr=0.5", "data.alpha=0.1", "seed=3"):
        assert training_view(load_config(overrides=[change])) != base, change


def test_runs_saved_before_the_schedule_and_canaries_still_match():
    """A run config without fl.lr_*, fl.bn_recalibration, fl.aggregation / data.poison.canar*
    keys (saved before they existed)."""
    import copy

    cfg = load_config("table2_cpu", ["data.poison.canaries=0"])
    old = copy.deepcopy(cfg)
    for k in ("lr_schedule", "lr_decay", "lr_min_ratio"):
        del old["fl"][k]
    for k in ("canary_clients", "canaries", "canary_copies"):
        del old["data"]["poison"][k]
    del old["fl"]["bn_recalibration"]
    del old["fl"]["aggregation"]
    assert training_view(old) == training_view(cfg)
    # switched on, they shape the run
    on = ("fl.lr_schedule=cosine", "data.poison.canaries=5", "fl.bn_recalibration=9")
    for override in (*on, "fl.aggregation={strategy: median}"):
        on = load_config("table2_cpu", ["data.poison.canaries=0", override])
        assert training_view(on) != training_view(cfg)
