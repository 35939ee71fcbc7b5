"""A trained run is reused when only unlearning settings change, never when training ones do."""

from scaleflu.config import load_config
from scaleflu.experiments.table2 import training_view


def test_training_view_ignores_unlearning_settings():
    base = training_view(load_config())
    unlearn_only = load_config(
        overrides=["scale.ppo.episodes=5", "scale.lambda=0.9", "baselines.fused.rank=4"]
    )
    assert training_view(unlearn_only) == base


def test_training_view_sees_what_shapes_the_run():
    base = training_view(load_config())
    for change in ("scale.groups_per_layer=4", "fl.lr=0.5", "data.alpha=0.1", "seed=3"):
        assert training_view(load_config(overrides=[change])) != base, change
