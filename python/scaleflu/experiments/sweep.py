"""The seeded sweep: SCALE against Retrain and the fine-tune control over seeds and alphas.

A federation is one setting and seed: a trained FL run (its config drawn from the seed, e.g.
:func:`cpu_federation`) and its requests. :func:`run_federation` unlearns every request with
Retrain, SCALE default and the fine-tune control (and, for the noise floor, an independent
Retrain, ``retrain-b``) as cells on :mod:`scaleflu.experiments.harness`, so a federation
resumes cell by cell; Retrain and SCALE are measured interleaved (their order alternates from
request to request) at the same torch thread count. Its rows (each method against the
reference Retrain and the control, :func:`scaleflu.experiments.criteria.sweep_row`) are written to
``OUT/unlearn_sweep/<setting>-s<seed>.json``; :func:`collect` gathers the federations and
:func:`sweep_table` summarises them as min / median / max per setting, with the noise floor's
tables (:func:`noise_floor_table`) when it was measured.

Where things live: the trained run and the Retrain cells (which do not depend on ``scale.*``)
under ``WORK/sweep/<setting>/``, so a sweep with other ``scale.*`` settings (another ``OUT``)
reuses them; the other cells under ``OUT/unlearn_sweep/<setting>/``.

Targets: backdoor ASR and FA within 0.05 of Retrain's, RA within 0.02, forgetting better than
the fine-tune control at equal or better RA, wall and CPU time at most 5 % of Retrain's
(docs/scale.md, "Over seeds and Dirichlet alphas").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scaleflu.config import Config, as_config, load_config, merge, parse_override
from scaleflu.experiments.cells import Cell, RunKey, read_result
from scaleflu.experiments.criteria import (
    AUDIT_AUC_TOL,
    AUDIT_TPR_TOL,
    MEMBERSHIP_FORGET_TOL,
    SWEEP_FORGET_TOL,
    SWEEP_RA_TOL,
    SWEEP_TIME,
    sweep_row,
)
from scaleflu.experiments.harness import (
    MethodFactory,
    Variant,
    default_factory,
    ensure_run,
    run_cells,
)
from scaleflu.fl.optim import preload_torch_optim
from scaleflu.unlearn.search import sb3_startup

log = logging.getLogger(__name__)

SWEEP_METHODS = ("retrain", "scale-default", "finetune")
# an independent Retrain (fresh init, selection, batch order from this seed offset + the
# federation's seed) scored against the reference Retrain like any method: how far two equally
# valid Retrains lie apart is the floor under the "within x of Retrain" targets
NOISE_FLOOR_METHOD = "retrain-b"
NOISE_FLOOR_SEED = 1000
# the sweep's federations: the packaged table2_cpu config (its evaluation protocol with power:
# backdoor_share, label-flip marker, calibrated MIA, scale.* sizes) with seed, alpha, the
# poisoned clients and the forgotten class drawn from the seed
SWEEP_BASE = "table2_cpu"
# methods whose cells stay with the trained run (they do not depend on scale.*)
KEPT_WITH_RUN = ("retrain", NOISE_FLOOR_METHOD)


@dataclass
class Federation:
    """One federation of the sweep: its setting, seed, experiment config and requests."""

    setting: str
    seed: int
    cfg: Config  # training and unlearning settings (experiment.scenarios: the requests)
    drawn: dict[str, Any] = field(default_factory=dict)  # what was drawn from the seed

    @property
    def name(self) -> str:
        """``<setting>-s<seed>``."""
        return f"{self.setting}-s{self.seed}"

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(scenario, request) pairs in order."""
        return [(str(k), str(v)) for k, v in dict(self.cfg.experiment.scenarios).items()]

    @property
    def key(self) -> RunKey:
        """The trained run."""
        c = self.cfg
        return RunKey(str(c.data.dataset), str(c.model.name), float(c.data.alpha), int(c.seed))


def draw_requests(seed: int, n_clients: int, poison: Mapping[str, Any]) -> dict[str, Any]:
    """Backdoor client, label-flip client and class drawn from the seed (not by hand).

    Requests: the backdoor client (``client``), the class over the whole federation (``class``),
    the label-flip client's flipped samples (``sample``, table2_cpu's sample scenario) and the
    backdoor client's triggered samples (``sample-bd``).
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 16]))
    bd, lf = (int(x) for x in rng.choice(n_clients, size=2, replace=False))
    cls = int(rng.integers(10))
    lf_frac = float(poison.get("label_flip_fraction") or 0.2)
    bd_frac = float(poison.get("backdoor_fraction") or 0.3)
    # with canaries the sample requests forget exactly the poisoned samples: the flips /
    # triggered samples and the client's memorised canaries
    canaries = bool(poison.get("canaries")) and bool(poison.get("canary_clients"))
    lf_req = f"sample:{lf}:poisoned" if canaries else f"sample:{lf}:{lf_frac:g}"
    bd_req = f"sample:{bd}:poisoned" if canaries else f"sample:{bd}:{bd_frac:g}"
    return {
        "backdoor_client": bd,
        "label_flip_client": lf,
        "class": cls,
        "requests": [
            ("client", f"client:{bd}"),
            ("class", f"class:{cls}"),
            ("sample", lf_req),
            ("sample-bd", bd_req),
        ],
    }


def federation_config(
    base: Mapping[str, Any],
    overrides: Sequence[str],
    requests: Sequence[tuple[str, str]],
    scale_set: Sequence[str] = (),
) -> Config:
    """``base`` with ``overrides``, the requests as its scenarios and ``scale_set`` on top."""
    cfg: Mapping[str, Any] = base
    for item in [*overrides, *scale_set]:
        cfg = merge(cfg, parse_override(item))
    out = as_config(merge(cfg, {"experiment": {"scale_mode": "default"}}))
    out["experiment"]["scenarios"] = dict(requests)  # these requests only
    return as_config(out)


def cpu_federation(
    seed: int,
    alpha: float,
    threads: int = 1,
    scale_set: Sequence[str] = (),
    quick: bool = False,
) -> Federation:
    """A CPU-sized federation (``SWEEP_BASE``) with its poisoned clients drawn from the seed.

    ``quick``: a smoke run of the machinery (3 rounds, 3000 images), not a measurement.
    """
    base = load_config(SWEEP_BASE)  # read each time: the packaged protocol flows in
    n = int(base["data"]["num_clients"])
    req = draw_requests(seed, n, base["data"]["poison"])
    over = [
        f"seed={seed}",
        f"data.alpha={alpha}",
        f"data.poison.backdoor_clients=[{req['backdoor_client']}]",
        f"data.poison.label_flip_clients=[{req['label_flip_client']}]",
        f"fl.threads={threads}",
    ]
    if base["data"]["poison"].get("canary_clients"):  # the canaries follow the draw
        over.append(
            f"data.poison.canary_clients=[{req['backdoor_client']}, {req['label_flip_client']}]"
        )
    if quick:
        over += ["fl.rounds=3", "data.train_subset=3000", "scale.eval.mia_shadows=0"]
        over += ["data.poison.canaries=5"]
    cfg = federation_config(base, over, req["requests"], scale_set)
    drawn = {k: v for k, v in req.items() if k != "requests"}
    return Federation(f"cpu-alpha{alpha}", seed, cfg, drawn)


def variants(seed: int) -> dict[str, Variant]:
    """The sweep's method names: SCALE in default mode, the independent Retrain's seed."""
    return {
        "scale-default": Variant("scale", params=(("mode", "default"),)),
        NOISE_FLOOR_METHOD: Variant("retrain", params=(("seed", NOISE_FLOOR_SEED + seed),)),
    }


def federation_path(out: Path, fed: Federation) -> Path:
    """The federation's rows: ``OUT/unlearn_sweep/<setting>-s<seed>.json``."""
    return Path(out) / "unlearn_sweep" / f"{fed.name}.json"


def run_federation(
    fed: Federation,
    out: Path,
    work: Path,
    noise_floor: bool = False,
    progress: bool = False,
    factory: MethodFactory = default_factory,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Train the federation and unlearn its requests (resumable cell by cell); write its rows.

    ``extra``: registered methods run on every request besides Retrain, SCALE and the control
    (e.g. ``pga``, ``not``), scored against Retrain and the control as SCALE is. Returns the
    federation's data (``complete`` once every cell has a result; ``failed``: the cells that
    failed, with their reasons, never scored).
    """
    out, work = Path(out), Path(work)
    run_root = work / "sweep" / fed.setting
    cell_root = out / "unlearn_sweep" / fed.setting

    def cell_dir(c: Cell) -> Path:
        return c.dir(run_root if c.method in KEPT_WITH_RUN else cell_root)

    data: dict[str, Any] = {"setting": fed.setting, "seed": fed.seed, "rows": []}
    path = federation_path(out, fed)
    if path.is_file():  # keeps the training time measured when it was trained
        old = json.loads(path.read_text())
        data.update({k: old[k] for k in ("train_wall_s", "train_cpu_s") if k in old})
    key = fed.key
    if not (run_root / "runs" / key.slug / "model.safetensors").is_file():
        t0, c0 = time.perf_counter(), time.process_time()
        ensure_run(fed.cfg, key, run_root, progress)
        data["train_wall_s"] = time.perf_counter() - t0
        data["train_cpu_s"] = time.process_time() - c0
        log.info("%s trained in %.1fs", fed.name, data["train_wall_s"])
    # the process's one-time imports (stable-baselines3, torch.optim's torch._dynamo) before any
    # method, so neither Retrain nor SCALE is charged for them (SCALE reports them as startup_s)
    data["startup_s"] = sb3_startup() + preload_torch_optim()
    cells = []
    for i, (scen, _) in enumerate(fed.requests):
        names = list(SWEEP_METHODS)
        if (fed.seed + i) % 2:  # interleaved: Retrain and SCALE alternate which goes first
            names[0], names[1] = names[1], names[0]
        names += [m for m in extra if m not in names]
        if noise_floor:
            names.append(NOISE_FLOOR_METHOD)
        cells += [Cell(key, scen, n) for n in names]
    status = run_cells(
        fed.cfg,
        run_root,
        cells,
        factory,
        progress,
        variants=variants(fed.seed),
        cell_dir=cell_dir,
        desc=fed.name,
    )
    data["drawn"] = fed.drawn
    data["rows"] = federation_rows(
        fed, {c: read_result(cell_dir(c) / "result.json") for c in cells}, extra
    )
    data["complete"] = all(s["status"] == "done" for s in status.values())
    data["failed"] = [
        {"cell": k, "error": v.get("error"), "stage": v.get("stage")}
        for k, v in status.items()
        if v["status"] == "failed"
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return data


def federation_rows(
    fed: Federation, results: Mapping[Cell, dict[str, Any] | None], extra: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One row per request with a reference Retrain: every method against it and the control."""
    rows = []
    for scen, req in fed.requests:
        res = {
            c.method: {**r, "variant": c.method}
            for c, r in results.items()
            if c.scenario == scen and r is not None
        }
        ref = res.get("retrain")
        if ref is None:
            continue
        control = res.get("finetune")
        compared = ("retrain", "finetune", NOISE_FLOOR_METHOD)
        methods = [
            sweep_row(res[n], ref, control if n not in compared else None)
            for n in dict.fromkeys((*SWEEP_METHODS, *extra, NOISE_FLOOR_METHOD))
            if n in res
        ]
        floor = next((r for r in methods if r["method"] == NOISE_FLOOR_METHOD), None)
        if floor is not None:  # beside the target: within the two Retrains' own distance
            floor["ok"] = {k: floor["ok"][k] for k in ("ra", "forget", "ra_clean")}
            for r in methods:
                if r["method"] not in ("retrain", NOISE_FLOOR_METHOD) and r["d_ra"] is not None:
                    tol = max(SWEEP_RA_TOL, abs(floor["d_ra"]))
                    r["ok"]["ra_floor"] = abs(r["d_ra"]) <= tol
        original = ref["original"]
        rows.append(
            {
                "setting": fed.setting,
                "seed": fed.seed,
                "scenario": scen,
                "request": req,
                "drawn": fed.drawn,
                "protocol": ref["protocol"],
                "original": {
                    k: original.get(k)
                    for k in ("test_acc", "ra", "fa_protocol", "backdoor_asr", "mia_loss_auc")
                },
                "methods": methods,
            }
        )
        for r in methods:
            log.info(
                "%s %s %s: acc %s RA %s forget %s time %.3f cpu %s ok %s",
                fed.name,
                scen,
                r["method"],
                fmt_value(r["test_acc"]),
                fmt_value(r["ra"]),
                fmt_value(r["forget"]),
                r["time_ratio"],
                fmt_value(r["cpu_ratio"]),
                r["ok"],
            )
    return rows


def fmt_value(v: Any) -> str:
    """A table value: ``-`` for None, floats to 3 decimals."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def collect(
    out: Path,
    feds: Sequence[Federation],
    command: str,
    threads: int,
    scale_set: Sequence[str] = (),
) -> dict[str, Any]:
    """The rows of every federation file that exists (finished or not)."""
    rows, fed_info, failed = [], [], []
    for fed in feds:
        p = federation_path(out, fed)
        if p.is_file():
            d = json.loads(p.read_text())
            rows += d["rows"]
            failed += [{"federation": fed.name, **f} for f in d.get("failed") or []]
            fed_info.append(
                {
                    k: d.get(k)
                    for k in ("setting", "seed", "complete", "train_wall_s", "train_cpu_s")
                }
            )
    return {
        "command": command,
        "threads": threads,
        "base": SWEEP_BASE,
        "scale_set": list(scale_set),
        "targets": {
            "forget_tol": SWEEP_FORGET_TOL,
            "ra_tol": SWEEP_RA_TOL,
            "time_ratio": SWEEP_TIME,
        },
        "federations": fed_info,
        "rows": rows,
        "failed": failed,
    }


def sweep_table(data: Mapping[str, Any]) -> str:
    """Min / median / max per (setting, scenario, method) and how many seeds met each target."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in data["rows"]:
        for r in row["methods"]:
            groups.setdefault((row["setting"], row["scenario"], r["method"]), []).append(r)

    def rng(vals: list[Any]) -> str:
        v = [x for x in vals if x is not None]
        if not v:
            return "-"
        return f"{min(v):.3f} / {float(np.median(v)):.3f} / {max(v):.3f}"

    lines = [
        "# Seeded sweep: SCALE default vs Retrain and the fine-tune control",
        "",
        f"Command: `{data.get('command', '')}`; torch threads {data.get('threads')}; base "
        f"config {data.get('base')}; scale overrides {data.get('scale_set')}. Each cell: "
        "min / median / max over the seeds that ran. forget = backdoor ASR (backdoor "
        "protocol) else FA on the protocol. Targets met (seeds meeting it / seeds): forget <= "
        "Retrain + 0.05, |dRA| <= 0.02 (ra_clean: the same on clean images and true "
        "labels), control = forget below the fine-tune control's at RA "
        ">= the control's - 0.02, time and CPU <= 5 % of Retrain's.",
        "",
        "| setting | request | method | seeds | test acc | RA | forget | MIA AUC (cal.) | "
        "audit AUC | audit TPR@1%FPR | dAUC (audit) | dTPR (audit) | dRA | "
        "dRA clean | time/Retrain | CPU/Retrain | CPU s | targets met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (setting, scen, method), rs in sorted(groups.items()):
        met: dict[str, int] = {}
        for r in rs:
            for key, val in r["ok"].items():
                met[key] = met.get(key, 0) + int(bool(val))
        tick = (
            ", ".join(f"{key} {n}/{len(rs)}" for key, n in met.items())
            if method != "retrain"
            else ""
        )
        lines.append(
            f"| {setting} | {scen} | {method} | {len(rs)} | "
            + " | ".join(
                rng([r.get(k) for r in rs])
                for k in (
                    "test_acc",
                    "ra",
                    "forget",
                    "mia_cal_auc",
                    "audit_auc",
                    "audit_tpr_1fpr",
                    "d_audit_auc",
                    "d_audit_tpr",
                    "d_ra",
                    "d_ra_clean",
                    "time_ratio",
                    "cpu_ratio",
                    "cpu_s",
                )
            )
            + f" | {tick} |"
        )
    lines += membership_table(data)
    if data.get("failed"):
        lines += ["", "## Failed cells (not scored)", ""]
        lines += [f"* {f['federation']} `{f['cell']}`: {f['error']}" for f in data["failed"]]
    lines += noise_floor_table(data)
    return "\n".join(lines) + "\n"


def membership_table(data: Mapping[str, Any]) -> list[str]:
    """Per setting and request: each method's seeds meeting the membership targets.

    ``audit``: the audit's AUC within 0.05 of Retrain's and TPR at 1 % FPR at most 0.03 above;
    ``membership``: that, with RA on true labels at most 0.02 below Retrain's and the forgetting
    within Retrain's + 0.02 (:mod:`scaleflu.experiments.criteria`). The control must fail
    ``audit`` for the audit to have power on that request.
    """
    per: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    for row in data["rows"]:
        for r in row["methods"]:
            if "audit" in r["ok"]:
                per.setdefault((row["setting"], row["scenario"]), {}).setdefault(
                    r["method"], []
                ).append(r)
    if not per:
        return []
    out = [
        "",
        "## The membership audit against Retrain (per seed)",
        "",
        f"audit: AUC within {AUDIT_AUC_TOL} of Retrain's and TPR@1%FPR at most {AUDIT_TPR_TOL} "
        f"above; membership: audit and RA on true labels at most {SWEEP_RA_TOL} below and the "
        "forgetting within "
        f"Retrain's + {MEMBERSHIP_FORGET_TOL}. The control failing `audit` is the audit's power.",
        "",
        "| setting | request | method | seeds | audited | dAUC min / median / max | "
        "dTPR min / median / max | audit | membership |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def rng(vals: list[Any]) -> str:
        v = [x for x in vals if x is not None]
        if not v:
            return "-"
        return f"{min(v):+.3f} / {float(np.median(v)):+.3f} / {max(v):+.3f}"

    for (setting, scen), ms in sorted(per.items()):
        for method, rs in sorted(ms.items()):
            sets = sorted({str(r.get("audit_set")) for r in rs})
            out.append(
                f"| {setting} | {scen} | {method} | {len(rs)} | {', '.join(sets)} | "
                f"{rng([r['d_audit_auc'] for r in rs])} | {rng([r['d_audit_tpr'] for r in rs])} | "
                f"{sum(bool(r['ok']['audit']) for r in rs)}/{len(rs)} | "
                f"{sum(bool(r['ok']['membership']) for r in rs)}/{len(rs)} |"
            )
    return out


def noise_floor_table(data: Mapping[str, Any]) -> list[str]:
    """SCALE's and the control's distance to Retrain beside Retrain's own (``retrain-b``).

    Per (setting, request): |dRA| of an independent Retrain (``retrain-b``) and of each method
    (min / median / max), the methods' mean dRA (a bias shows as a mean away from 0, the
    independent Retrain's as noise around it), and how many seeds are within 0.02, within
    max(0.02, that seed's two-Retrain distance) and no farther than the independent Retrain.
    Two tables: RA on the protocol's labels (``d_ra``: the remaining clients' flips and
    canaries count as correct when predicted with their poisoned label) and on clean images
    with true labels (``d_ra_clean``). No rows with an independent Retrain: no table.
    """
    out = _noise_floor_section(data, "d_ra", "on the protocol's labels")
    if out:
        out += _noise_floor_section(data, "d_ra_clean", "on clean images, true labels")
    return out


def _noise_floor_section(data: Mapping[str, Any], key: str, title: str) -> list[str]:
    per: dict[tuple[str, str], list[dict[str, dict[str, Any]]]] = {}
    for row in data["rows"]:
        m = {r["method"]: r for r in row["methods"]}
        if NOISE_FLOOR_METHOD in m and m[NOISE_FLOOR_METHOD].get(key) is not None:
            per.setdefault((row["setting"], row["scenario"]), []).append(m)
    if not per:
        return []

    def rng(vals: list[float]) -> str:
        return f"{min(vals):.3f} / {float(np.median(vals)):.3f} / {max(vals):.3f}"

    def ra_vs_control(m: dict[str, dict[str, Any]]) -> float | None:
        # SCALE's RA minus the fine-tune control's (both distances to the same Retrain)
        if "finetune" not in m or m["finetune"].get(key) is None:
            return None
        return m["scale-default"][key] - m["finetune"][key]

    out = [
        "",
        f"## Retrain's own spread (`--noise-floor`): RA {title} (`{key}`)",
        "",
        f"`{NOISE_FLOOR_METHOD}`: an independent Retrain (`baselines.retrain.seed` = "
        f"{NOISE_FLOOR_SEED} + the seed: fresh initial model, selection and batch order) scored "
        "against the reference Retrain. \\|dRA\\| min / median / max; mean dRA (signed); seeds "
        "within 0.02 / within max(0.02, that seed's two-Retrain |dRA|) / with |dRA| no larger "
        "than the independent Retrain's; SCALE's forgetting below the control's at RA no lower "
        "than the control's minus max(0.02, the two-Retrain |dRA|).",
        "",
        "| setting | request | seeds | \\|dRA\\| retrain-b | mean dRA retrain-b | method | "
        "\\|dRA\\| | mean dRA | within 0.02 (retrain-b) | within 0.02 | within the floor "
        "| <= retrain-b | beats the control within the floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (setting, scen), ms in sorted(per.items()):
        b = [m[NOISE_FLOOR_METHOD][key] for m in ms]
        for method in ("scale-default", "finetune"):
            pairs = [
                (m[method][key], m[NOISE_FLOOR_METHOD][key])
                for m in ms
                if method in m and m[method].get(key) is not None
            ]
            if not pairs:
                continue
            d = [p[0] for p in pairs]
            n = len(pairs)
            within = sum(abs(x) <= SWEEP_RA_TOL for x in d)
            floor = sum(abs(x) <= max(SWEEP_RA_TOL, abs(y)) for x, y in pairs)
            closer = sum(abs(x) <= abs(y) for x, y in pairs)
            # better forgetting than the control at RA within the floor of the control's
            ctl = "-"
            if method == "scale-default":
                won = []
                for m in ms:
                    if method not in m:
                        continue
                    dra = ra_vs_control(m)
                    won.append(
                        m[method].get("d_forget_control") is not None
                        and dra is not None
                        and m[method]["d_forget_control"] < 0
                        and dra >= -max(SWEEP_RA_TOL, abs(m[NOISE_FLOOR_METHOD][key]))
                    )
                ctl = f"{sum(won)}/{len(won)}"
            out.append(
                f"| {setting} | {scen} | {n} | {rng([abs(x) for x in b])} | "
                f"{float(np.mean(b)):+.3f} | {method} | {rng([abs(x) for x in d])} | "
                f"{float(np.mean(d)):+.3f} | {sum(abs(x) <= SWEEP_RA_TOL for x in b)}/{len(b)} | "
                f"{within}/{n} | {floor}/{n} | {closer}/{n} | {ctl} |"
            )
    return out
