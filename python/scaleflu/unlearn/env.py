"""Phase II of SCALE as a gymnasium environment: AoI-driven sparsification of the top-M layers.

State H[t] = {A_lj, mu_lj, sigma_lj} over the top-M layers x G groups, padded to a fixed
``(M, G, F)`` array and flattened. A is divided by its maximum over the groups; mu and sigma are
divided by the layer's standard deviation in Theta (a scaling for the policy network only).
The default mode appends three features per group: the zeroed fraction of the group, the
layer's normalised sensitivity S_l / max S and the remaining episode budget.

Action (l, G, s) encoded for SB3 PPO as ``MultiDiscrete([M, 2, ..., 2, K])``: a layer slot, G
binary group flags and a ratio index k with s = (k + 1) / K. The paper's continuous s in [0, 1]
becomes K levels (``scale.s_levels``); s = 0 is left out (it changes nothing). Flags of groups a
layer does not have (G_l < G) are ignored; an action with no valid flag changes nothing and
earns 0 (the paper's R_c divides by |G| and is undefined there).

Sparsify (docs/scale.md, "Phase II"): ``paper`` zeroes the floor(s |W_lj|) smallest-magnitude
entries of each chosen group (the authors' magnitude pruning); ``default`` zeroes the round(s
|W_lj|) entries with the largest attribution: the accumulated target contribution |C|
(:mod:`scaleflu.unlearn.sensitivity`), or for a class removed from the whole federation a class
saliency on the server's validation set (``EnvSpec.attribution``; ``subtract`` removes
``EnvSpec.contribution``, C_l, whichever map orders the entries).

Rewards, with A read before the step:

* ``paper``: R_f = sum_{j in G} S_l / max S * s, R_c = 1/|G| sum_{j in G} A_lj / max A * s,
  R = w_f R_f + w_c R_c (the paper's equations; they grow with s and |G|), where the sums run
  over the chosen groups the step changed: a group whose floor(s |W_lj|) smallest entries are
  already 0 is left as it was and earns nothing (the literal equations pay s for it anyway).
* ``default``: s is replaced by what the step really did. R_f = S_l / max S * (|C| mass newly
  zeroed in the chosen groups / |C| mass of layer l); R_c = 1/|G| sum A_lj / max A * dz_lj with
  dz_lj the newly zeroed fraction of the group; a per-episode budget caps the zeroed share of the
  top-M layers (the step is cut to what fits, the episode ends when it is spent); and a utility
  term R_u = (acc_t - acc_{t-1}) / acc_0 on the server's validation set, weight w_u.
  R = w_f R_f + w_c R_c + w_u R_u. With ``measure_every: episode`` the measured terms (R_u and
  a measured R_f) are paid once at the episode's last step for the whole episode (they
  telescope, so the return is the same) at one validation pass per episode.

AoI: every step advances the round clock by one and the link clock by the time to broadcast the
changed groups; changed groups get T_lj = now (:class:`scaleflu.unlearn.aoi.AoITracker`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from scaleflu.unlearn.aoi import AoITracker, GroupKey

log = logging.getLogger(__name__)

Utility = Callable[[Mapping[str, torch.Tensor]], float]


@dataclass
class EnvSpec:
    """Static inputs of the sparsification environment."""

    mode: str  # paper | default
    layers: list[str]  # L_s, the top-M layers, in slot order
    groups: dict[str, list[tuple[int, int]]]  # (start, end) chunks of each flattened layer
    weights: dict[str, torch.Tensor]  # Theta's tensors of those layers (original shapes)
    score: dict[str, float]  # S_l of those layers
    aoi: AoITracker  # AoI state at the start of unlearning
    G: int  # groups per layer (padding width)
    s_levels: int = 10
    episode_steps: int = 8
    w_f: float = 1.0
    w_c: float = 1.0
    w_u: float = 0.0  # default mode
    budget: float | None = None  # default mode: max zeroed share of the top-M parameters
    attribution: dict[str, torch.Tensor] = field(default_factory=dict)  # default mode: C_l
    utility: Utility | None = None  # default mode: validation accuracy of given layer weights
    aoi_unit: str = "seconds"
    op: str = "zero"  # default mode: zero | subtract (W_i - C_i instead of 0; an option)
    # default mode: C_l for ``subtract`` when ``attribution`` is another map (class saliency)
    contribution: dict[str, torch.Tensor] = field(default_factory=dict)
    # default mode: accuracy on the server's validation samples of a forgotten class; when set,
    # R_f is the measured drop of it (the class requests' forgetting is observable there)
    forget_utility: Utility | None = None
    # default mode: when the measured terms (R_u, measured R_f) are paid: ``step`` (after every
    # step that changed something) or ``episode`` (once, at the episode's last step, for the
    # whole episode: the same return, since both terms telescope, at one forward pass per
    # episode instead of one per step)
    measure_every: str = "step"  # SCALE passes scale.measure_every (default: episode)

    def __post_init__(self) -> None:
        if self.mode not in ("paper", "default"):
            raise ValueError(f"mode must be paper or default, got {self.mode!r}")
        if self.mode == "default" and not self.attribution:
            raise ValueError("default mode needs the attribution map C_l")
        if self.op not in ("zero", "subtract"):
            raise ValueError(f"sparsify op must be zero or subtract, got {self.op!r}")
        if self.measure_every not in ("step", "episode"):
            raise ValueError(f"measure_every must be step or episode, got {self.measure_every!r}")
        if self.s_levels < 1 or self.episode_steps < 1 or not self.layers:
            raise ValueError("s_levels, episode_steps and the layer list must be positive")


@dataclass
class EpisodeRecord:
    """A finished episode: its return, final layer tensors, AoI state, Sum AoI and steps."""

    ret: float
    layers: dict[str, torch.Tensor]
    aoi: AoITracker
    sum_aoi_trace: list[float]
    steps: list[dict[str, Any]]
    zeroed_share: float
    util_gain: float = 0.0  # sum of R_u over the episode: (utility_T - utility_0) / utility_0
    key: bytes = b""  # digest of the sparsified set (two records with one key are one state)


class SparsifyEnv(gym.Env):
    """The MDP of Phase II; one episode sparsifies a fresh copy of Theta's top-M layers."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, spec: EnvSpec) -> None:
        """Precompute group orders (attribution or nothing) and the spaces."""
        super().__init__()
        self.spec = spec
        self.M = len(spec.layers)
        self.G = spec.G
        self.default = spec.mode == "default"
        self.F = 6 if self.default else 3
        self.action_space = spaces.MultiDiscrete([self.M] + [2] * self.G + [spec.s_levels])
        self.observation_space = spaces.Box(
            low=-np.inf, high=np.inf, shape=(self.M * self.G * self.F,), dtype=np.float32
        )
        self._flat0 = {k: spec.weights[k].detach().flatten().double().clone() for k in spec.layers}
        self._scale = {k: float(self._flat0[k].std()) or 1.0 for k in spec.layers}
        self._max_score = max(spec.score[k] for k in spec.layers) or 1.0
        self._keys: dict[str, list[GroupKey]] = {
            k: [(k, j) for j in range(len(spec.groups[k]))] for k in spec.layers
        }
        self._aoi_idx = {key: spec.aoi.index(key) for ks in self._keys.values() for key in ks}
        self._bounds = {
            k: (
                torch.tensor([a for a, _ in spec.groups[k][: self.G]], dtype=torch.int64),
                torch.tensor([b for _, b in spec.groups[k][: self.G]], dtype=torch.int64),
            )
            for k in spec.layers
        }
        self._order: dict[GroupKey, torch.Tensor] = {}
        self._attr_mass: dict[str, float] = {}
        if self.default:
            for k in spec.layers:
                a = spec.attribution[k].detach().flatten().double().abs()
                self._attr_mass[k] = float(a.sum()) or 1.0
                for j, (s, e) in enumerate(spec.groups[k]):
                    self._order[(k, j)] = torch.argsort(a[s:e], descending=True, stable=True)
        self._attr = {k: v.detach().flatten().double() for k, v in spec.attribution.items()}
        self._attr_abs = {k: v.abs() for k, v in self._attr.items()}
        contrib = spec.contribution or spec.attribution
        self._contrib = {k: v.detach().flatten().double() for k, v in contrib.items()}
        self.total_params = sum(self._flat0[k].numel() for k in spec.layers)
        self.episode_returns: list[float] = []
        self.episode_infos: list[dict[str, float]] = []
        self.keep_best = False
        self.best_return = -np.inf
        self.best: EpisodeRecord | None = None
        self.keep_top = 1  # with keep_best: how many of the best distinct episodes to keep
        self.top: list[EpisodeRecord] = []  # best first
        self._util_cache: dict[bytes, float] = {}
        self.utility_evals = self.utility_hits = 0
        self.utility_s = 0.0  # seconds spent in utility forward passes
        self.reset()

    # -- state ---------------------------------------------------------------------------

    def _aoi_values(self) -> np.ndarray:
        return self.aoi.aoi_seconds() if self.spec.aoi_unit == "seconds" else self.aoi.aoi_rounds()

    def _aoi_of(self, values: np.ndarray) -> dict[GroupKey, float]:
        return {key: float(values[i]) for key, i in self._aoi_idx.items()}

    @staticmethod
    def _group_sums(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Sum of ``x[s:e]`` for every group, from one cumulative sum (float64)."""
        c = torch.cat([x.new_zeros(1), x.cumsum(0)])
        return c[ends] - c[starts]

    def _obs(self) -> np.ndarray:
        obs = np.zeros((self.M, self.G, self.F), dtype=np.float32)
        vals = self._aoi_values()
        amax = max((float(vals[i]) for i in self._aoi_idx.values()), default=0.0) or 1.0
        left = self.budget_left / self.budget_total if self.budget_total else 1.0
        for m, k in enumerate(self.spec.layers):
            starts, ends = self._bounds[k]
            n = len(starts)
            size = (ends - starts).double()
            w = self.cur[k]
            mean = self._group_sums(w, starts, ends) / size
            var = (self._group_sums(w * w, starts, ends) / size - mean * mean).clamp_min(0.0)
            obs[m, :n, 0] = [float(vals[self._aoi_idx[(k, j)]]) / amax for j in range(n)]
            obs[m, :n, 1] = (mean / self._scale[k]).numpy()
            obs[m, :n, 2] = (var.sqrt() / self._scale[k]).numpy()
            if self.default:
                z = self._group_sums(self.zeroed[k].double(), starts, ends) / size
                obs[m, :n, 3] = z.numpy()
                obs[m, :n, 4] = self.spec.score[k] / self._max_score
                obs[m, :n, 5] = left
        return obs.reshape(-1)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Restore Theta's layers, the AoI state and the budget."""
        super().reset(seed=seed)
        self.cur = {k: v.clone() for k, v in self._flat0.items()}
        self.zeroed = {k: torch.zeros(v.numel(), dtype=torch.bool) for k, v in self._flat0.items()}
        self.aoi = self.spec.aoi.copy()
        self.t = 0
        self.ret = 0.0
        self.budget_total = (
            int(self.spec.budget * self.total_params)
            if self.default and self.spec.budget is not None
            else 0
        )
        self.budget_left = self.budget_total
        self.util0 = self.util_prev = 1.0
        if self.default and self.spec.utility is not None and self.spec.w_u:
            self.util0 = self.util_prev = max(self._utility(), 1e-6)
        self.fu0 = self.fu_prev = 1.0
        if self.default and self.spec.forget_utility is not None:
            self.fu0 = self.fu_prev = max(self._utility(forget=True), 1e-6)
        self.sum_aoi_trace: list[float] = []
        self.step_infos: list[dict[str, Any]] = []
        self.dirty = False  # whether a step of this episode changed the layers
        return self._obs(), {}

    def state_key(self) -> bytes:
        """Digest of the sparsified set, which alone determines the layers in default mode."""
        h = hashlib.blake2b(digest_size=20)  # a digest: big layers' masks are megabytes
        for k in self.spec.layers:
            h.update(np.packbits(self.zeroed[k].numpy()).tobytes())
        return h.digest()

    def _utility(self, forget: bool = False) -> float:
        """The utility of the current layers, memoised on the set of sparsified entries.

        In default mode the layers are a function of that set alone (Sparsify writes 0, or
        W - C, at the chosen entries of Theta), so an episode that reaches a state seen before
        (PPO repeats itself more as it converges, and every reset starts from Theta) costs
        no forward pass. Exact: the cached value is the value that would be computed.
        """
        fn = self.spec.forget_utility if forget else self.spec.utility
        assert fn is not None
        key = self.state_key() + (b"f" if forget else b"")
        hit = self._util_cache.get(key)
        if hit is None:
            t0 = time.perf_counter()
            hit = self._util_cache[key] = float(fn(self.layer_state()))
            self.utility_s += time.perf_counter() - t0
            self.utility_evals += 1
        else:
            self.utility_hits += 1
        return hit

    def layer_state(self) -> dict[str, torch.Tensor]:
        """The current top-M layer tensors in their original shapes and dtypes."""
        return {
            k: self.cur[k].view_as(self.spec.weights[k]).to(self.spec.weights[k].dtype)
            for k in self.spec.layers
        }

    # -- step ----------------------------------------------------------------------------

    def decode(self, action: Sequence[int] | np.ndarray) -> tuple[str, list[int], float]:
        """(layer, chosen groups, s) of an encoded action."""
        a = np.asarray(action, dtype=np.int64).reshape(-1)
        layer = self.spec.layers[int(a[0]) % self.M]
        n_groups = len(self.spec.groups[layer])
        chosen = [j for j in range(min(self.G, n_groups)) if a[1 + j]]
        s = (int(a[-1]) + 1) / self.spec.s_levels
        return layer, chosen, s

    def _plan(self, layer: str, j: int, s: float) -> torch.Tensor:
        """Flat indices (into the layer) Sparsify would zero in group j at ratio s."""
        start, end = self.spec.groups[layer][j]
        size = end - start
        if self.default:
            k = int(round(s * size))
            idx = self._order[(layer, j)][:k] + start
        else:
            k = int(np.floor(s * size))
            mag = self.cur[layer][start:end].abs()
            idx = torch.argsort(mag, stable=True)[:k] + start
        return idx

    def step(
        self, action: Sequence[int] | np.ndarray
    ) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Apply Sparsify(Theta', l, G, s), advance AoI, return the reward of the step."""
        layer, chosen, s = self.decode(action)
        aoi_before = self._aoi_of(self._aoi_values())
        amax = max(aoi_before.values()) or 1.0
        rel = self.spec.score[layer] / self._max_score
        r_f = r_c = r_u = 0.0
        changed: list[GroupKey] = []
        if chosen:
            plans = {j: self._plan(layer, j, s) for j in chosen}
            if self.default:
                plans = {j: idx[~self.zeroed[layer][idx]] for j, idx in plans.items()}
                want = sum(len(v) for v in plans.values())
                if self.budget_total and want > self.budget_left:
                    # cut to what fits: the same share of each group, leftovers to the first
                    frac = self.budget_left / max(want, 1)
                    keep = {j: int(np.floor(frac * len(v))) for j, v in plans.items()}
                    spare = self.budget_left - sum(keep.values())
                    for j, v in plans.items():
                        extra = min(spare, len(v) - keep[j])
                        keep[j] += extra
                        spare -= extra
                    plans = {j: v[: keep[j]] for j, v in plans.items()}
            for j, idx in plans.items():
                start, end = self.spec.groups[layer][j]
                size = end - start
                before = self.cur[layer][idx].clone()
                if self.default and self.spec.op == "subtract":
                    self.cur[layer][idx] = self._flat0[layer][idx] - self._contrib[layer][idx]
                else:
                    self.cur[layer][idx] = 0.0
                did = bool(len(idx)) and bool((before != self.cur[layer][idx]).any())
                if self.default:
                    newly = len(idx)
                    self.zeroed[layer][idx] = True
                    self.budget_left -= newly
                    dz = newly / size
                    r_f += rel * float(self._attr_abs[layer][idx].sum()) / self._attr_mass[layer]
                    r_c += aoi_before[(layer, j)] / amax * dz
                elif did:
                    # the paper's terms, paid only for a group the step changed: pruning entries
                    # that are already 0 leaves the model as it was and earns nothing
                    r_f += rel * s
                    r_c += aoi_before[(layer, j)] / amax * s
                if did:
                    changed.append((layer, j))
            r_c /= len(chosen)
        exhausted = self.default and self.budget_total > 0 and self.budget_left <= 0
        last = bool(exhausted) or self.t + 1 >= self.spec.episode_steps
        self.dirty = self.dirty or bool(changed)
        # the measured terms: after a step that changed something, or once at the episode's end
        measure = changed if self.spec.measure_every == "step" else (last and self.dirty)
        if self.default and self.spec.forget_utility is not None:
            r_f = 0.0  # measured instead: the share of the class's accuracy removed
            if measure:
                fu = self._utility(forget=True)
                r_f = (self.fu_prev - fu) / self.fu0
                self.fu_prev = fu
        if self.default and measure and self.spec.utility is not None and self.spec.w_u:
            util = self._utility()
            r_u = (util - self.util_prev) / self.util0
            self.util_prev = util
        link_s = self.aoi.step(changed)
        reward = self.spec.w_f * r_f + self.spec.w_c * r_c + self.spec.w_u * r_u
        self.t += 1
        self.ret += reward
        sum_aoi = float(np.sum(list(self._aoi_of(self.aoi.aoi_seconds()).values())))
        self.sum_aoi_trace.append(sum_aoi)
        terminated = bool(exhausted)
        truncated = self.t >= self.spec.episode_steps and not terminated
        info = {
            "layer": layer,
            "groups": chosen,
            "s": s,
            "r_f": r_f,
            "r_c": r_c,
            "r_u": r_u,
            "link_s": link_s,
            "changed": len(changed),
            "changed_groups": [j for _, j in changed],
            "sum_aoi_s": sum_aoi,
            "utility": self.util_prev,
            "forget_acc": self.fu_prev if self.spec.forget_utility is not None else None,
        }
        self.step_infos.append({**info, "reward": float(reward)})
        if terminated or truncated:
            if self.keep_best:
                self._keep()
            self.episode_returns.append(self.ret)
            self.episode_infos.append(
                {"return": self.ret, "utility": self.util_prev, "zeroed": self.zeroed_share()}
            )
        return self._obs(), float(reward), terminated, truncated, info

    def _keep(self) -> None:
        """Record the finished episode among the ``keep_top`` best distinct ones."""
        worst = self.top[-1].ret if len(self.top) >= self.keep_top else -np.inf
        if self.ret <= worst:
            return
        key = self.state_key() if self.default else b""
        same = next((r for r in self.top if self.default and r.key == key), None)
        if same is not None:
            if self.ret <= same.ret:
                return  # the same state reached before with a better AoI return
            self.top.remove(same)
        self.top.append(
            EpisodeRecord(
                self.ret,
                {k: v.clone() for k, v in self.layer_state().items()},
                self.aoi.copy(),
                list(self.sum_aoi_trace),
                list(self.step_infos),
                self.zeroed_share(),
                (self.util_prev - self.util0) / self.util0,
                key,
            )
        )
        self.top.sort(key=lambda r: -r.ret)
        del self.top[self.keep_top :]
        self.best = self.top[0]
        self.best_return = self.best.ret

    def zeroed_share(self) -> float:
        """Share of the top-M parameters Sparsify changed (zeroed, or subtracted in default)."""
        if self.default:
            done = sum(int(self.zeroed[k].sum()) for k in self.spec.layers)
            return done / max(self.total_params, 1)
        newly = sum(
            int(((self.cur[k] == 0) & (self._flat0[k] != 0)).sum()) for k in self.spec.layers
        )
        return newly / max(self.total_params, 1)
