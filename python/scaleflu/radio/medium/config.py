"""Configuration of the shared medium: the channel of each link, the lockstep, the broker.

``MediumConfig`` (with one :class:`LinkChannel` per directed link, or a default and positions
for a log-distance path loss) is what the broker serves; ``MediumConfig.from_dict`` reads it
from plain data (a YAML or JSON file), rejecting unknown keys and wrong types with the key named.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

DEFAULT_MEDIUM_ADDRESS = "tcp://127.0.0.1:53100"


MAX_NODE_ID = 0xFFFE


@dataclass(frozen=True)
class LinkChannel:
    """Channel of one directed link (transmitter -> receiver)."""

    snr_db: float | None = 20.0  # mean SNR at the receiver; None: from distance_m or positions
    distance_m: float | None = None  # used when snr_db is None
    cfo: float = 0.0  # carrier offset, cycles per sample (1/64 = one subcarrier at FFT 64)
    delay: float = 0.0  # timing offset in samples (>= 0, fractional allowed)
    sro_ppm: float = 0.0  # sample-rate offset of the transmitter's clock, parts per million
    fading: str = "none"  # "none", "rayleigh" or "rician"
    k_factor_db: float = 6.0  # Rician K (line-of-sight over scattered power)
    doppler_hz: float = 2.0  # maximum Doppler of the fading
    pdp: tuple[float, ...] = (1.0,)  # power delay profile, one tap per sample of delay
    in_range: bool = True  # False: the receiver hears nothing of this transmitter

    def validate(self) -> None:
        """Raise ValueError on a setting the model cannot apply."""
        if self.fading not in ("none", "rayleigh", "rician"):
            raise ValueError(f"fading must be none, rayleigh or rician, got {self.fading!r}")
        if self.distance_m is not None and not self.distance_m > 0:
            raise ValueError("distance_m must be > 0")
        if not 0 <= self.delay <= 4096:
            raise ValueError("delay must be within [0, 4096] samples")
        if abs(self.cfo) >= 0.5:
            raise ValueError("cfo must be within (-0.5, 0.5) cycles per sample")
        if abs(self.sro_ppm) > 1000:
            raise ValueError("sro_ppm must be within +-1000")
        if self.doppler_hz < 0:
            raise ValueError("doppler_hz must be >= 0")
        p = np.asarray(self.pdp, dtype=float)
        if p.ndim != 1 or not 1 <= len(p) <= 64 or np.any(p < 0) or not p.sum() > 0:
            raise ValueError("pdp must be 1..64 non-negative powers, not all zero")
        for v in (self.cfo, self.delay, self.sro_ppm, self.k_factor_db, self.doppler_hz):
            if not math.isfinite(v):
                raise ValueError("link channel parameters must be finite")


@dataclass(frozen=True)
class MediumConfig:
    """The medium: sample clock, lockstep block, channels per link, broker address."""

    nodes: tuple[int, ...] = ()  # nodes the first step waits for (empty: start with the first)
    samp_rate: float = 5e6  # samples per virtual second
    block: int = 8192  # samples per lockstep step
    seed: int = 0
    default: LinkChannel = field(default_factory=LinkChannel)
    links: Mapping[tuple[int, int], LinkChannel] = field(default_factory=dict)  # (tx, rx)
    positions: Mapping[int, tuple[float, float]] = field(default_factory=dict)  # metres
    ref_snr_db: float = 40.0  # path loss: SNR at ref_distance_m
    ref_distance_m: float = 1.0
    path_loss_exp: float = 3.0
    noise: bool = True  # unit-power noise at every receiver
    half_duplex: bool = True  # a receiver hears nothing while its own transmitter is on
    address: str = DEFAULT_MEDIUM_ADDRESS
    node_timeout: float = 60.0  # wall seconds a node may take for one step before it is dropped
    idle_blocks: int = 4  # quiet steps after the last burst before the idle pace and stride
    # a receiver that heard no transmitter for this many steps gets no samples (its last frame
    # is flushed by the burst's own zero padding; noise alone decodes to nothing)
    deaf_blocks: int = 2
    idle_speed: float = 1.0  # virtual / wall time while idle (<= 0: as fast as possible)
    idle_stride: int = 16  # blocks per step while idle and nobody has anything to send
    # Star of a hub (the edge server): the other nodes only take frames from the hub, so their
    # receivers get no samples while only non-hub nodes transmit (after idle_blocks steps, as
    # for silence). What they hear of the hub, collisions with anyone included, is unchanged;
    # it saves the robots' receivers from demodulating each other's uploads (they would drop
    # them). None: every receiver hears everything.
    hub: int | None = None

    def __post_init__(self) -> None:
        if not 256 <= self.block <= 1 << 20:
            raise ValueError("block must be within [256, 1048576] samples")
        if not self.samp_rate > 0:
            raise ValueError("samp_rate must be > 0")
        if self.node_timeout <= 0 or self.idle_blocks < 1 or self.deaf_blocks < 1:
            raise ValueError("node_timeout must be > 0, idle_blocks and deaf_blocks >= 1")
        if not 1 <= self.idle_stride <= 1024:
            raise ValueError("idle_stride must be within [1, 1024] blocks")
        for n in self.nodes:
            _check_node(n)
        if self.hub is not None:
            _check_node(self.hub)
        self.default.validate()
        for (a, b), ch in self.links.items():
            _check_node(a)
            _check_node(b)
            ch.validate()

    def channel(self, tx: int, rx: int) -> LinkChannel:
        """The channel of link tx -> rx (positions give the distance where no SNR is set)."""
        ch = self.links.get((tx, rx), self.default)
        if ch.snr_db is None and ch.distance_m is None:
            pa, pb = self.positions.get(tx), self.positions.get(rx)
            if pa is None or pb is None:
                raise ValueError(f"link {tx}->{rx} has no snr_db, distance_m or positions")
            ch = replace(ch, distance_m=max(1e-3, math.dist(pa, pb)))
        return ch

    def snr_db(self, ch: LinkChannel) -> float:
        """Mean SNR of a link: given, or log-distance path loss from ``ref_snr_db``."""
        if ch.snr_db is not None:
            return float(ch.snr_db)
        d = max(float(ch.distance_m or self.ref_distance_m), 1e-3)
        return self.ref_snr_db - 10 * self.path_loss_exp * math.log10(d / self.ref_distance_m)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MediumConfig:
        """From plain data (YAML/JSON): links as {"tx->rx": {...}}, unknown keys rejected.

        Every error is a ValueError with the offending key (the data may come from a file).
        """
        if not isinstance(d, Mapping):
            raise ValueError("medium config must be a mapping")
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown medium keys: {sorted(unknown)}")
        try:
            if "default" in d:
                d["default"] = _link_channel(d["default"])
            if "links" in d:
                links = {}
                for k, v in _mapping(d["links"], "links").items():
                    a, sep, b = str(k).partition("->")
                    if not sep:
                        raise ValueError(f"links: key {k!r} is not 'tx->rx'")
                    links[(_check_node(int(a)), _check_node(int(b)))] = _link_channel(v)
                d["links"] = links
            if "positions" in d:
                pos = {}
                for k, v in _mapping(d["positions"], "positions").items():
                    xy = tuple(float(x) for x in v)
                    if len(xy) != 2 or not all(math.isfinite(x) for x in xy):
                        raise ValueError(f"positions: node {k} needs finite [x, y]")
                    pos[_check_node(int(k))] = xy
                d["positions"] = pos
            if "nodes" in d:
                d["nodes"] = tuple(_check_node(int(n)) for n in d["nodes"])
            if d.get("hub") is not None:
                if isinstance(d["hub"], bool) or not isinstance(d["hub"], int):
                    raise ValueError(f"hub must be a node id, got {d['hub']!r}")
                d["hub"] = _check_node(d["hub"])
            for key, typ in (
                ("samp_rate", float),
                ("block", int),
                ("seed", int),
                ("ref_snr_db", float),
                ("ref_distance_m", float),
                ("path_loss_exp", float),
                ("node_timeout", float),
                ("idle_blocks", int),
                ("deaf_blocks", int),
                ("idle_speed", float),
                ("idle_stride", int),
            ):
                if key in d:
                    if isinstance(d[key], bool) or not isinstance(d[key], (int, float)):
                        raise ValueError(f"{key} must be a number, got {d[key]!r}")
                    d[key] = typ(d[key])
            for key in ("noise", "half_duplex"):
                if key in d and not isinstance(d[key], bool):
                    raise ValueError(f"{key} must be true or false")
            if "address" in d and not isinstance(d["address"], str):
                raise ValueError("address must be a string like tcp://127.0.0.1:53100")
            return cls(**d)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"medium config: {exc}") from None


def _mapping(v: Any, what: str) -> Mapping[Any, Any]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{what} must be a mapping")
    return v


def _link_channel(d: Any) -> LinkChannel:
    d = _mapping(d, "a link channel")
    known = {f.name for f in fields(LinkChannel)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown link channel keys: {sorted(unknown)}")
    d = dict(d)
    for key in ("snr_db", "distance_m", "cfo", "delay", "sro_ppm", "k_factor_db", "doppler_hz"):
        v = d.get(key)
        if v is None and key in ("snr_db", "distance_m"):
            continue
        if key in d and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{key} must be a number, got {v!r}")
        if key in d:
            d[key] = float(v)
            if not math.isfinite(d[key]):
                raise ValueError(f"{key} must be finite")
    if "in_range" in d and not isinstance(d["in_range"], bool):
        raise ValueError("in_range must be true or false")
    if "pdp" in d:
        d["pdp"] = tuple(float(x) for x in d["pdp"])
    ch = LinkChannel(**d)
    ch.validate()
    return ch


def _check_node(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_NODE_ID:
        raise ValueError(f"node id must be an integer in [0, {MAX_NODE_ID}], got {n!r}")
    return int(n)
