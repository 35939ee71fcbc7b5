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
   statistics (``fl.bn_recalibration``), then run the acceptance checks on the candidate model:
   any check may refuse the round (:class:`RoundRejectedError`; the previous model stays).
4. **evaluate and record** (:meth:`FedAvg.evaluate`, :func:`close_round`): the server's own
   evaluation of Theta[t+1] (test accuracy and loss, attack success rate), then the round is
   recorded in the history store.

Who runs rounds through it: ``fl.run.train`` (training), ``UnlearnContext.fedavg_rounds``
(Retrain, the fine-tune control, PGA's post rounds, SCALE's recovery rounds, the MIA reference
models), FedEraser (its calibration, through ``adjust``), FUSED (its adapters, with its own
local trainer) and the edge server's round scheduler. Plug points: ``norm_prior`` (the trusted
norms that bound the updates of small rounds) and ``checks`` (tests of the candidate model
before it is accepted).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from scaleflu.fl.aggregation import AggregationConfig, robust_aggregate, screening_config
from scaleflu.fl.data import ImageData
from scaleflu.fl.fedavg import LocalTrainer, attack_success_rate, evaluate, select_clients

State = dict[str, torch.Tensor]


@dataclass
class RoundResult:
    """An aggregated round: Theta[t+1] and what it was made of.

    ``clients``: the accepted participants, in the order their local models were aggregated;
    ``sizes`` and ``states``: their data sizes M_n and local models Theta_{n,E}[t];
    ``refused``: the screened-out ones with the reason; ``norms``: every update's norm (empty
    without screening).
    """

    t: int
    state: State
    clients: list[int]
    sizes: dict[int, int]
    states: dict[int, State]
    refused: dict[int, str] = field(default_factory=dict)
    norms: dict[int, float] = field(default_factory=dict)

    @classmethod
    def unchanged(cls, t: int, state: Mapping[str, torch.Tensor]) -> RoundResult:
        """A round without participants: Theta[t+1] = Theta[t] (a copy)."""
        return cls(t, {k: v.clone() for k, v in state.items()}, [], {}, {})


class NormPrior(Protocol):
    """Trusted update norms for the norm bound of round t's few updates (may be empty)."""

    def __call__(self, t: int, base: Mapping[str, torch.Tensor], clients: list[int]) -> list[float]:
        """Norms the updates of ``clients`` (trained from ``base``) are held against."""
        ...


class AcceptanceCheck(Protocol):
    """A test of the candidate model before the round is accepted."""

    def __call__(self, previous: Mapping[str, torch.Tensor], result: RoundResult) -> str | None:
        """Why ``result.state`` must not replace ``previous`` (None: accept)."""
        ...


class RoundRejectedError(ValueError):
    """An acceptance check refused the round's aggregate; the previous model stays."""

    def __init__(self, reason: str, result: RoundResult) -> None:
        super().__init__(f"round {result.t} rejected: {reason}")
        self.reason = reason
        self.result = result


NOT_EVALUATED: dict[str, Any] = {"test_acc": None, "test_loss": None}


class CentralEvaluator:
    """The server's evaluation of a global model (Flower's ``evaluate_fn``): test accuracy and
    mean loss, and with a backdoor configured the attack success rate on the triggered set."""

    def __init__(
        self,
        model: nn.Module,
        test: ImageData,
        batch_size: int = 1000,
        triggered: ImageData | None = None,
        target_label: int | None = None,
    ) -> None:
        self.model, self.test, self.batch_size = model, test, int(batch_size)
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
    every aggregate. ``evaluator``: the central evaluation. ``norm_prior``, ``checks``: see the
    module docstring.
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
        checks: Sequence[AcceptanceCheck] = (),
    ) -> None:
        self.sizes = {int(n): int(m) for n, m in sizes.items()}
        self.seed = int(seed)
        self.clients_per_round = None if clients_per_round is None else int(clients_per_round)
        self.screening = screening
        self.recalibrate_fn = recalibrate
        self.evaluator = evaluator
        self.norm_prior = norm_prior
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
        sizes = {n: self.sizes[n] for n in replies}
        prior: Sequence[float] = ()
        if self.screening is not None and self.norm_prior is not None:
            prior = self.norm_prior(t, base, list(replies))
        agg = robust_aggregate(base, replies, sizes, self.screening, prior)
        state = agg.state if adjust is None else adjust(agg.state)
        result = RoundResult(
            t,
            self.recalibrate(state),
            list(agg.accepted),
            {n: sizes[n] for n in agg.accepted},
            {n: dict(replies[n]) for n in agg.accepted},
            agg.refused,
            agg.norms,
        )
        for check in self.checks:
            reason = check(base, result)
            if reason is not None:
                raise RoundRejectedError(reason, result)
        return result

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
