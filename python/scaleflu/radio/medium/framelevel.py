"""The shared medium at frame level: the MAC simulator with the sample level's timing and losses.

:func:`frame_level` runs one scheduled FedAvg round in the frame-level simulator
(:func:`scaleflu.link.macsim.simulate_round`) with what the sample-level medium adds fitted in:
a burst starts at the next lockstep block (``START_QUANTUM_S``) and a node acts on a frame about
2.5 blocks after its last sample (``RX_LATENCY_S``: the node's port may run one block ahead of
its receiver, plus the OFDM receiver's own pipeline); :func:`fading_snr` gives each frame the
SNR of the medium's own fading trace (same seed, links and virtual time), and the simulator
loses it by the PHY's measured frame error rate at that SNR and the frame's MCS (the stock PHY,
or the coded PHY's MCS table: ``scaleflu.link.mcs.frame_error_rate``). The constants are
fitted to the sample level; the measurements behind them are in docs/link.md, section 11.2.
The benchmarks that hold the two levels side by side (benchmarks/mac_sample_level.py,
benchmarks/mac_fading_tail.py) share it. numpy only, no GNU Radio.
"""

from __future__ import annotations

from collections.abc import Callable

from scaleflu.link.arq import ArqConfig
from scaleflu.link.defaults import ARQ_DEFAULTS
from scaleflu.link.fading import link_snr
from scaleflu.link.mac import MacConfig
from scaleflu.link.macsim import simulate_round

LENET_BYTES = 247210  # the LeNet-5 state dict in the wire format (raw float32)


PAD = 160  # zero samples after every burst (ofdm_link_tx post_padding): not counted as airtime


SAMP_RATE = 5e6


BLOCK = 8192  # the medium's lockstep block (MediumConfig.block)


# Fitted to the sample level (AWGN runs, docs/link.md 11.2): a burst starts at the next lockstep
# block, and a node acts on a frame about 2.5 blocks after its last sample (the node's port may
# run one block ahead of its receiver, rx_lag=1, plus the OFDM receiver's own pipeline).
START_QUANTUM_S = BLOCK / SAMP_RATE


RX_LATENCY_S = 2.5 * BLOCK / SAMP_RATE


def fading_snr(
    seed: int,
    snr_db: float,
    fading: str,
    t_offset: float,
    k_factor_db: float = 6.0,
    doppler_hz: float = 2.0,
) -> Callable[[int, int, float], float]:
    """snr_fn for MacSim: the SNR of each link at virtual time t, from the medium's own fading
    trace (``scaleflu.link.fading.link_snr``: the trace ``MediumModel`` draws for that link with
    that seed; ``t_offset``: the medium's virtual time at the simulation's t = 0)."""
    return link_snr(seed, snr_db, fading, k_factor_db, doppler_hz, t_offset)


def frame_level(
    size: int,
    mac: MacConfig,
    seed: int,
    deadline: float,
    fitted: bool = True,
    snr_fn=None,
    *,
    robots: int = 3,
    train_s: float = 0.0,
    train_jitter_s: float = 0.0,
    arq: dict | None = None,
) -> dict:
    """The same round at frame level: ideal, or with the sample level's timing fitted in.

    ``robots``, ``train_s``/``train_jitter_s`` (training time between model and upload) and
    ``arq`` (ArqConfig overrides) default to one round of three robots without training time;
    ``snr_fn`` (:func:`fading_snr`) loses frames on a fading channel, at the MCS each frame
    goes at (``mac.mcs``: link adaptation; None: the stock PHY).
    """
    arq_cfg = ArqConfig(**{**ARQ_DEFAULTS["mac"], **(arq or {})}, deadline=deadline)
    r = simulate_round(
        "scheduled",
        robots,
        size,
        train_s=train_s,
        train_jitter_s=train_jitter_s,
        deadline_s=deadline,
        seed=seed,
        mac=mac,
        arq=arq_cfg,
        snr_fn=snr_fn,
        rx_latency_s=RX_LATENCY_S if fitted else 0.0,
        start_quantum_s=START_QUANTUM_S if fitted else 0.0,
    )
    pad = PAD / SAMP_RATE
    by_node = {int(n): a for n, a in r["airtime_by_node_s"].items()}
    frames = {int(n): k for n, k in r["frames_by_node"].items()}
    nonzero = {n: by_node[n] - frames[n] * pad for n in by_node}
    return {
        "round_s": max(r["update_s"].values()) if r["update_s"] else None,
        "models_s": r["model_s"],
        "updates_s": r["update_s"],
        "airtime_by_node_s": nonzero,
        "airtime_total_s": sum(nonzero.values()),
        "server_s": nonzero.get(0, 0.0),
        "robots_s": sum(v for n, v in nonzero.items() if n != 0),
        "frames_by_node": frames,
        "collided_frames": r["collided_frames"],
        "bcast_passes": r["broadcast"]["passes"],
        "grants": r["mac"]["grants_tx"],
        "grant_timeouts": r["mac"]["grant_timeouts"],
        "lost_link": r["lost_link"],
        "bit_exact": r["models_bit_exact"] == robots and r["updates_bit_exact"] == robots,
        "bytes_by_mcs": r["bytes_by_mcs"],
        "adaptation": r.get("adaptation"),
    }
