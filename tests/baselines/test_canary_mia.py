"""The canary MIA has power: the trained model's canaries are found, Retrain's are not.

A small run of the protocol with power plus membership canaries (data.poison.canaries: clean
samples with a random wrong label, each held several times by its client) on the attacker
(client 0, 30 % of the data). The calibrated reference-model attack on the canaries of D_u
against their held-out twins (same true class, relabelled alike, never trained on) must score
the trained model far above 0.5 and Retrain near 0.5, for the client request and for the
sample request that forgets client 0's poisoned samples with every canary copy. Measured on
this run: client request 0.900 -> Retrain 0.527, sample request 0.864 -> 0.537. (At this
size, 6 rounds with 4 of 8 clients, a 15 % client's canaries were not memorised: 0.54; the
table2_cpu runs are in docs/reproducing.md, "Canary sizing".)
"""

from __future__ import annotations

from typing import Any

import pytest

from tiny_run_helpers import needs_fmnist

pytestmark = needs_fmnist


@pytest.mark.parametrize("request_text", ["client:0", "sample:0:poisoned"])
def test_canary_mia_finds_the_trained_model_not_retrain(
    canary_run: tuple[Any, dict[str, Any]], request_text: str
) -> None:
    from scaleflu.experiments.harness import make_context
    from scaleflu.unlearn.baselines import get_method

    run, cfg = canary_run
    ctx = make_context(run, request_text, cfg, progress=False)
    assert len(ctx.canary_target) == 40 == len(ctx.canary_nonmembers)
    o = ctx.original_metrics()
    m = get_method("retrain", cfg).run(ctx).metrics
    print(
        f"{request_text}: canary AUC {o['mia_canary_auc']:.3f} -> Retrain "
        f"{m['mia_canary_auc']:.3f}; TPR@1%FPR {o['mia_canary_tpr_1fpr']:.3f} -> "
        f"{m['mia_canary_tpr_1fpr']:.3f}; class-matched AUC {o['mia_ref_auc']}"
    )
    assert o["mia_canary_n"] == m["mia_canary_n"] == 40
    assert o["mia_canary_auc"] > 0.72
    assert abs(m["mia_canary_auc"] - 0.5) < 0.15
    assert o["mia_canary_auc"] > m["mia_canary_auc"] + 0.25
    assert o["mia_canary_tpr_1fpr"] > m["mia_canary_tpr_1fpr"]


def test_a_class_request_holds_too_few_canaries_to_audit(
    canary_run: tuple[Any, dict[str, Any]],
) -> None:
    """class:1 holds only the canaries labelled 1 by chance: counted, not scored."""
    from scaleflu.experiments.harness import make_context

    run, cfg = canary_run
    cfg = {**cfg, "scale": {**cfg["scale"], "eval": {**cfg["scale"]["eval"], "mia_shadows": 0}}}
    ctx = make_context(run, "class:1", cfg, progress=False)
    o = ctx.original_metrics()
    assert 0 < o["mia_canary_n"] < int(cfg["scale"]["eval"]["canary_min"])
    assert o["mia_canary_auc"] is None and o["mia_canary_loss_auc"] is None
