"""One FedAvg round, written once, in the manner of a Flower Strategy.

A round t of FedAvg is split the way Flower's ``Strategy`` splits it (``configure_train``,
``aggregate_train``, the centralised ``evaluate_fn``); the delivery in between -- the global
model to the clients, their local models back -- is the deployment's:

1. **configure** (:meth:`FedAvg.configure_train`): C[t], the clients that train in round t.
   With ``clients_per_round`` the seeded selection of the paper (:func:`select_clients`, the
   same for a run, its Retrain and its resumption), less the clients without data; without it
   every available client (the edge server's robots).
2. **deliver** (the deployment): each client of C[t] trains from Theta[t] and replies with its
   local model -- a :class:`~scaleflu.fl.fedavg.LocalTrainer` in the simulation
   (:meth:`FedAvg.fit_round`), the link in the testbed (``scaleflu.testbed.rounds``).
3. **aggregate** (:meth:`FedAvg.aggregate_train`): screen the updates (robust aggregation,
   :mod:`scaleflu.fl.aggregation`; on at the edge server, off by default in the simulation:
   ``fl.aggregation``), aggregate the accepted local models, re-estimate the BatchNorm
   statistics (``fl.bn_recalibration``), then run the acceptance checks on the candidate model
   (:class:`ValidationCheck`: its accuracy on the server's validation data against the previous
   model's). A refused candidate is attributed by leave-one-out: the updates whose removal
   lets a candidate pass are named and refused (``CandidateRejection``), and the round is that
   candidate without them; when no such candidate exists within half the updates, the round is
   refused (:class:`RoundRejectedError`; the previous model stays).
4. **evaluate and record** (:meth:`FedAvg.evaluate`, :func:`close_round`): the server's own
   evaluation of Theta[t+1] (test accuracy and loss, attack success rate), then the round is
   recorded in the history store.

Who runs rounds through it: ``fl.run.train`` (training), ``UnlearnContext.fedavg_rounds``
(Retrain, the fine-tune control, PGA's post rounds, SCALE's recovery rounds, the MIA reference
models), FedEraser (its calibration, through ``adjust``), FUSED (its adapters, with its own
local trainer) and the edge server's round scheduler. Plug points: ``norm_prior`` (the trusted
norms that bound the updates of small rounds), ``reference`` (the server's own update, whose
direction those updates must not oppose) and ``checks`` (tests of the candidate model before
it is accepted).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from scaleflu.fl.aggregation import AggregationConfig, robust_aggregate, screening_config
from scaleflu.fl.data import ImageData
from scaleflu.fl.fedavg import (
    LocalTrainer,
    attack_success_rate,
    derive_seed,
    evaluate,
    select_clients,
)

State = dict[str, torch.Tensor]

log = logging.getLogger(__name__)


@dataclass
class CandidateRejection:
    """A round's candidate model refused by an acceptance check, and who caused it.

    ``reason``: the check's; ``named``: the clients whose updates were left out (leave-one-out,
    in the order they were found) with why; ``scores``: the check's score (validation accuracy)
    of the previous model, of the refused candidate and of each candidate tried without one
    more update.
    """

    reason: str
    named: dict[int, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """For rounds.jsonl and the report (client ids as given)."""
        return {
            "reason": self.reason,
            "named": sorted(self.named),
            "scores": {k: round(v, 4) for k, v in self.scores.items()},
        }


@dataclass
class RoundResult:
    """An aggregated round: Theta[t+1] and what it was made of.

    ``clients``: the accepted participants, in the order their local models were aggregated;
    ``sizes`` and ``states``: their data sizes M_n and local models Theta_{n,E}[t];
    ``refused``: the screened-out ones with the reason; ``norms``: every update's norm (empty
    without screening); ``rejected``: the candidate an acceptance check refused before this
    one (None: the first candidate was accepted).
    """

    t: int
    state: State
    clients: list[int]
    sizes: dict[int, int]
    states: dict[int, State]
    refused: dict[int, str] = field(default_factory=dict)
    norms: dict[int, float] = field(default_factory=dict)
    rejected: CandidateRejection | None = None

    @classmethod
    def unchanged(cls, t: int, state: Mapping[str, torch.Tensor]) -> RoundResult:
        """A round without participants: Theta[t+1] = Theta[t] (a copy)."""
        return cls(t, {k: v.clone() for k, v in state.items()}, [], {}, {})


class NormPrior(Protocol):
    """Trusted update norms for the norm bound of round t's few updates (may be empty)."""

    def __call__(self, t: int, base: Mapping[str, torch.Tensor], clients: list[int]) -> list[float]:
        """Norms the updates of ``clients`` (trained from ``base``) are held against."""
        ...


class ReferenceUpdate(Protocol):
    """The server's own update of round t for the direction test of a small round (or None)."""

    def __call__(
        self, t: int, base: Mapping[str, torch.Tensor], clients: list[int]
    ) -> State | None:
        """Its update ``Delta_ref`` (float64 tensors) from ``base`` for ``clients``' round."""
        ...


class AcceptanceCheck(Protocol):
    """A test of the candidate model before the round is accepted.

    A check may also offer ``score(state) -> float`` (higher is better): the round then uses it
    to find which updates caused a refusal (leave-one-out, :meth:`FedAvg.aggregate_train`).
    """

    def __call__(self, previous: Mapping[str, torch.Tensor], result: RoundResult) -> str | None:
        """Why ``result.state`` must not replace ``previous`` (None: accept)."""
        ...


class RoundRejectedError(ValueError):
    """An acceptance check refused the round's aggregate; the previous model stays.

    ``rejection``: the refused candidate's reason, scores and the clients named (those whose
    removal was tried; none of the candidates without them passed).
    """

    def __init__(
        self, reason: str, result: RoundResult, rejection: CandidateRejection | None = None
    ) -> None:
        super().__init__(f"round {result.t} rejected: {reason}")
        self.reason = reason
        self.result = result
        self.rejection = rejection or CandidateRejection(reason)


def validation_indices(seed: int, n: int, size: int) -> np.ndarray:
    """The server's validation slice: ``size`` seeded indices of a test split of ``n`` images
    (the same slice for its reference update and its acceptance check)."""
    rng = np.random.default_rng(derive_seed(int(seed), 91))
    return rng.permutation(n)[: max(1, min(int(size), n))]


class ValidationCheck:
    """Acceptance check on the server's validation data (:class:`AcceptanceCheck`).

    A candidate is refused when its accuracy on ``data`` is more than ``margin`` below the
    previous model's: the server saw its own model fall. In the round of :class:`FedAvg` its
    :meth:`score` also names the updates at fault (leave-one-out). ``model`` is the network the
    states are loaded into (not the server's own evaluation model: a refused candidate must not
    linger in it).
    """

    def __init__(
        self, model: nn.Module, data: ImageData, margin: float, batch_size: int | None = None
    ) -> None:
        if margin < 0:
            raise ValueError(f"acceptance margin must be >= 0, got {margin}")
        self.model, self.data, self.margin = model, data, float(margin)
        self.batch_size = batch_size  # None: the device's (scaleflu.fl.device.infer_batch)

    @classmethod
    def from_config(
        cls, cfg: AggregationConfig | None, model: nn.Module, test: ImageData, seed: int
    ) -> ValidationCheck | None:
        """The check of ``acceptance_margin`` on ``acceptance_samples`` of the validation slice
        of ``test`` (None when the margin is null)."""
        if cfg is None or cfg.acceptance_margin is None:
            return None
        idx = validation_indices(seed, len(test), int(cfg.acceptance_samples))
        return cls(model, test.subset(np.sort(idx)), float(cfg.acceptance_margin))

    @torch.no_grad()
    def score(self, state: Mapping[str, torch.Tensor]) -> float:
        """Accuracy of ``state`` on the validation data."""
        self.model.load_state_dict(state)
        return float(evaluate(self.model, self.data, self.batch_size)["acc"])

    def fall(self, before: float, after: float) -> str | None:
        """Why a candidate scoring ``after`` falls too far below the previous model's
        ``before`` (None: within the margin)."""
        if before - after > self.margin:
            return (
                f"validation accuracy {after:.3f}, {before - after:.3f} below the previous "
                f"model's {before:.3f} (margin {self.margin:g})"
            )
        return None

    def __call__(self, previous: Mapping[str, torch.Tensor], result: RoundResult) -> str | None:
        """Why the candidate falls too far below ``previous`` on validation (None: accept)."""
        return self.fall(self.score(previous), self.score(result.state))


NOT_EVALUATED: dict[str, Any] = {"test_acc": None, "test_loss": None}


class CentralEvaluator:
    """The server's evaluation of a global model (Flower's ``evaluate_fn``): test accuracy and
    mean loss, and with a backdoor configured the attack success rate on the triggered set."""

    def __init__(
        self,
        model: nn.Module,
        test: ImageData,
        batch_size: int | None = None,
        triggered: ImageData | None = None,
        target_label: int | None = None,
    ) -> None:
        self.model, self.test, self.batch_size = model, test, batch_size  # None: the device's
        self.triggered, self.target_label = triggered, target_label

    def __call__(self, state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """``test_acc``, ``test_loss`` and (with a triggered set) ``asr`` of ``state``."""
        self.model.load_state_dict(state)
        ev = evaluate(self.model, self.test, self.batch_size)
        metrics: dict[str, Any] = {"test_acc": ev["acc"], "test_loss": ev["loss"]}
        if self.triggered is not None:
            metrics["asr"] = attack_success_rate(
                self.model, self.triggered, int(self.target_label or 0)
            )
        return metrics


class FedAvg:
    """The server's side of a FedAvg round (module docstring), over clients ``0..len(sizes)-1``.

    ``sizes``: every client's data size M_n (0: no data, never selected). ``seed`` and
    ``clients_per_round``: the selection (None: every available client). ``screening``: robust
    aggregation (None: plain FedAvg). ``recalibrate``: the BatchNorm re-estimation applied to
    every aggregate. ``evaluator``: the central evaluation. ``norm_prior``, ``reference``,
    ``checks``: see the module docstring.
    """

    def __init__(
        self,
        sizes: Mapping[int, int],
        seed: int,
        clients_per_round: int | None = None,
        *,
        screening: AggregationConfig | None = None,
        recalibrate: Callable[[State], State] | None = None,
        evaluator: Callable[[Mapping[str, torch.Tensor]], dict[str, Any]] | None = None,
        norm_prior: NormPrior | None = None,
        reference: ReferenceUpdate | None = None,
        checks: Sequence[AcceptanceCheck] = (),
    ) -> None:
        self.sizes = {int(n): int(m) for n, m in sizes.items()}
        self.seed = int(seed)
        self.clients_per_round = None if clients_per_round is None else int(clients_per_round)
        self.screening = screening
        self.recalibrate_fn = recalibrate
        self.evaluator = evaluator
        self.norm_prior = norm_prior
        self.reference = reference
        self.checks = list(checks)

    @classmethod
    def from_config(
        cls, cfg: Mapping[str, Any], sizes: Mapping[int, int], seed: int | None = None, **parts: Any
    ) -> FedAvg:
        """The run's round: the selection of ``fl.clients_per_round`` seeded by ``seed`` (None:
        the run's), screening per ``fl.aggregation`` (null: plain FedAvg); ``parts``: the
        keyword arguments of the constructor (recalibrate, evaluator, ...)."""
        fl = cfg["fl"]
        screening = screening_config(fl.get("aggregation"), "fl.aggregation")
        seed = int(cfg["seed"]) if seed is None else int(seed)
        return cls(sizes, seed, int(fl["clients_per_round"]), screening=screening, **parts)

    # -- 1. configure ---------------------------------------------------------------------

    def configure_train(self, t: int, available: Sequence[int] | None = None) -> list[int]:
        """C[t]: the clients that train in round ``t``, among ``available`` (None: all).

        Clients without data are left out; the seeded selection keeps its order (ascending).
        """
        has_data = [n for n in sorted(self.sizes) if self.sizes[n] > 0]
        if self.clients_per_round is None:
            pool = has_data if available is None else sorted(set(available) & set(has_data))
            return pool
        chosen = select_clients(self.seed, t, len(self.sizes), self.clients_per_round)
        ok = set(has_data) if available is None else set(has_data) & set(available)
        return [n for n in chosen if n in ok]

    # -- 3. aggregate ---------------------------------------------------------------------

    def aggregate_train(
        self,
        t: int,
        base: Mapping[str, torch.Tensor],
        replies: Mapping[int, Mapping[str, torch.Tensor]],
        adjust: Callable[[State], State] | None = None,
    ) -> RoundResult:
        """Theta[t+1] from the local models ``replies`` trained from ``base`` = Theta[t].

        Screening (when configured) first; the accepted models are aggregated in the order of
        ``replies``; ``adjust`` (FedEraser's calibration) turns the aggregate into the round's
        model before the BatchNorm re-estimation; then every acceptance check. Raises
        :class:`~scaleflu.fl.aggregation.NoUpdateAcceptedError` when the screening refuses every
        update, :class:`RoundRejectedError` when a check refuses the candidate.
        """
        prior: Sequence[float] = ()
        ref: State | None = None
        if self.screening is not None and self.norm_prior is not None:
            prior = self.norm_prior(t, base, list(replies))
        if self.screening is not None and self.reference is not None:
            ref = self.reference(t, base, list(replies))
        screen = (prior, ref)
        result = self._candidate(t, base, replies, screen, adjust)
        scorer = next((c for c in self.checks if isinstance(c, ValidationCheck)), None)
        if scorer is None:
            reason = self._check(base, result)
            if reason is not None:
                raise RoundRejectedError(reason, result)
            return result
        return self._validated(t, base, replies, screen, adjust, result, scorer)

    def _candidate(
        self,
        t: int,
        base: Mapping[str, torch.Tensor],
        replies: Mapping[int, Mapping[str, torch.Tensor]],
        screen: tuple[Sequence[float], State | None],
        adjust: Callable[[State], State] | None,
    ) -> RoundResult:
        """Screen and aggregate ``replies`` into the round's candidate (no checks);
        ``screen``: the trusted norms and the reference update of the round."""
        sizes = {n: self.sizes[n] for n in replies}
        agg = robust_aggregate(base, replies, sizes, self.screening, *screen)
        state = agg.state if adjust is None else adjust(agg.state)
        return RoundResult(
            t,
            self.recalibrate(state),
            list(agg.accepted),
            {n: sizes[n] for n in agg.accepted},
            {n: dict(replies[n]) for n in agg.accepted},
            agg.refused,
            agg.norms,
        )

    def _check(
        self,
        base: Mapping[str, torch.Tensor],
        result: RoundResult,
        skip: AcceptanceCheck | None = None,
    ) -> str | None:
        """The first acceptance check's refusal of ``result`` (None: every check accepts)."""
        for check in self.checks:
            if check is skip:
                continue
            reason = check(base, result)
            if reason is not None:
                return reason
        return None

    def _validated(
        self,
        t: int,
        base: Mapping[str, torch.Tensor],
        replies: Mapping[int, Mapping[str, torch.Tensor]],
        screen: tuple[Sequence[float], State | None],
        adjust: Callable[[State], State] | None,
        result: RoundResult,
        scorer: ValidationCheck,
    ) -> RoundResult:
        """The round's candidate as the validation check accepts it, found by leave-one-out.

        A candidate the checks refuse (its validation accuracy falls more than the margin below
        the previous model's, or another check refuses it) is attributed greedily: of the
        candidates without one more of its updates, the one scoring best on validation is
        taken and that update named; this repeats until a candidate passes, naming at most half
        of the round's accepted updates (more at fault is not a few bad robots). Then the round
        is that candidate; else it is refused (:class:`RoundRejectedError`, the previous model
        stays). Leave-one-out rather than each update's own contribution: an update is judged
        by what the round would have been without it, the model the server would otherwise
        accept, and it needs no model of how updates combine (screening, robust strategies).
        """
        rejection = CandidateRejection("")
        before = scorer.score(base)
        rejection.scores["previous"] = before
        cand, remaining = result, list(result.clients)
        limit = len(remaining) // 2
        while True:
            after = scorer.score(cand.state)
            reason = scorer.fall(before, after) or self._check(base, cand, skip=scorer)
            log.debug("round %d: validation %.3f before, %.3f with %s", t, before, after, remaining)
            if reason is None:
                if cand is not result:
                    cand.refused = {**result.refused, **cand.refused, **rejection.named}
                    cand.norms = dict(result.norms)
                    cand.rejected = rejection
                return cand
            if not rejection.reason:
                rejection.reason = reason
                rejection.scores["candidate"] = after
            if len(rejection.named) >= limit:
                raise RoundRejectedError(rejection.reason, result, rejection)
            best: tuple[float, int, RoundResult] | None = None
            for n in remaining:
                rest = {m: replies[m] for m in remaining if m != n}
                try:
                    other = self._candidate(t, base, rest, screen, adjust)
                except ValueError:  # the screening refuses every other update
                    continue
                score = scorer.score(other.state)
                rejection.scores[f"without_{n}"] = score
                if best is None or score > best[0]:
                    best = (score, n, other)
            if best is None:
                raise RoundRejectedError(rejection.reason, result, rejection)
            score, worst, cand = best
            remaining.remove(worst)
            rejection.named[worst] = (
                f"aggregate: the round without this update scores {score:.3f} on the "
                f"server's validation data, with it {after:.3f}"
            )

    def recalibrate(self, state: State) -> State:
        """The BatchNorm re-estimation of an aggregate (the state itself when none is set)."""
        return state if self.recalibrate_fn is None else self.recalibrate_fn(state)

    # -- 4. evaluate ----------------------------------------------------------------------

    def evaluate(self, t: int, state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """The server's evaluation of Theta[t+1] (``test_acc`` and ``test_loss`` None without an
        evaluator)."""
        return dict(NOT_EVALUATED) if self.evaluator is None else self.evaluator(state)

    # -- the simulation's delivery ----------------------------------------------------------

    def fit_round(
        self, t: int, state: Mapping[str, torch.Tensor], trainer: LocalTrainer
    ) -> RoundResult | None:
        """Configure, train C[t] locally with ``trainer``, aggregate; None when C[t] is empty.

        A trainer may leave out clients that failed (the Ray backend); the round aggregates
        the replies it got.
        """
        clients = self.configure_train(t)
        if not clients:
            return None
        return self.aggregate_train(t, state, trainer.train(state, clients, t))


def close_round(
    history: Any, result: RoundResult, metrics: Mapping[str, Any], started: float
) -> tuple[float, dict[str, float]]:
    """Record an aggregated (or unchanged) round in the history store.

    ``started``: the round's start (``time.perf_counter``). Returns the round's wall time and
    the store's link accounting ``{"link_s", "cum_link_s", "bytes"}``.
    """
    wall = time.perf_counter() - started
    link = history.record_round(
        result.t,
        result.clients,
        result.sizes,
        result.states,
        result.state,
        dict(metrics),
        wall,
    )
    return wall, link
