#!/usr/bin/env python3
"""Link benchmark: scaleflu tensor goodput vs the stock gr-digital OFDM chain fed at full speed,
tail latency at 40 % loss, FER vs SNR, stock back-to-back loss with and without padding, bytes
on air per encoding.

Run by hand (about 3-4 minutes on 2 cores)::

    .venv/bin/python benchmarks/link_bench.py          # -> benchmarks/results/link_bench.{json,png}
    .venv/bin/python benchmarks/link_bench.py --quick  # fewer frames and repetitions
    .venv/bin/python benchmarks/link_bench.py --goodput-only --reps 7   # -> link_goodput.json
    .venv/bin/python benchmarks/link_bench.py --tails 100               # -> link_tails.json
    .venv/bin/python benchmarks/link_bench.py --auth --reps 5           # -> link_auth.json

The stock contender is what a new user builds: a vector source of tagged 1500 B frames into
``digital.ofdm_tx`` -> channel -> ``digital.ofdm_rx``, no Python in the loop, carrying as many
payload bytes as our message; each repetition measures it and our stack (20 dB, and 20 dB with
5 % of frames dropped) in alternating order, and the ratios are per repetition.

Everything runs in one process on this machine's CPU: "rate" here is how fast GNU Radio
modulates, passes through the channel model and demodulates, not an air-interface rate (the
on-air numbers at 5 MS/s are computed from samples per frame). Our stack and the stock chain are
measured in the same run with the same FFT, CP, modulation, frame size and channel.

The file is long (about 770 lines) because its measurements share the stock chain's flowgraph
helpers and the result file: one function per measurement (``stock_*``, ``our_goodput``,
``tail_*``, ``fer_point``, ``encoding_sizes``) and ``main`` choosing among them.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("GR_DONT_LOAD_PREFS", "1")

import pmt  # noqa: E402
from gnuradio import blocks, channels, digital, gr, pdu  # noqa: E402

from scaleflu.link.frame import FRAME_OVERHEAD, max_payload  # noqa: E402
from scaleflu.link.samples import lenet_like  # noqa: E402
from scaleflu.link.wire import Encoding, Message, MessageType, encode_message  # noqa: E402
from scaleflu.radio.links import OfdmLoopbackNetwork  # noqa: E402
from scaleflu.radio.ofdm import ofdm_carriers, ofdm_link_rx, ofdm_link_tx, samples_per_frame  # noqa: E402
from scaleflu.radio.phy import ChannelConfig, PhyConfig, burst_power  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FRAME = 1500  # frame bytes on both chains
MULTIPATH = (1.0, 0.3 + 0.2j, 0.1j)
CFO = 0.002
SAMP_RATE = 5e6  # for on-air numbers only

log = logging.getLogger("link_bench")


def _thread_cpu() -> dict[str, tuple[str, float]]:
    """CPU seconds of every thread of this process, by thread id: (name, seconds). GNU Radio
    names each block's thread after the block and its id (truncated to 15 characters)."""
    out: dict[str, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):  # not Linux
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (comm, (int(fields[11]) + int(fields[12])) / tick)
    return out


def _thread_profile(before: dict, after: dict, top: int = 25) -> dict[str, float]:
    """CPU seconds per block type (thread name without its trailing id) between two snapshots,
    the largest first: where a measurement's time went (threads that ended are missing)."""
    import re

    agg: dict[str, float] = {}
    for tid, (comm, cpu) in after.items():
        name = re.sub(r"\d+$", "", comm) or comm
        agg[name] = agg.get(name, 0.0) + cpu - before.get(tid, (comm, 0.0))[1]
    return dict(
        sorted(((k, round(v, 3)) for k, v in agg.items() if v > 0), key=lambda kv: -kv[1])[:top]
    )


def _u8(data: bytes):
    return pmt.init_u8vector(len(data), list(data))


def _nv(snr_db: float, power: float) -> float:
    return math.sqrt(power / 10 ** (snr_db / 10.0))


def _taps() -> list[complex]:
    t = np.asarray(MULTIPATH, dtype=np.complex128)
    return list(t / np.sqrt(np.sum(np.abs(t) ** 2)))


def _stock_tx_rx(mob: int):
    occ, pil, psym = ofdm_carriers(64)
    kw = dict(
        fft_len=64,
        cp_len=16,
        packet_length_tag_key="packet_len",
        occupied_carriers=occ,
        pilot_carriers=pil,
        pilot_symbols=psym,
        bps_header=1,
        bps_payload=2,
        scramble_bits=True,
    )
    tx = digital.ofdm_tx(**kw)
    rx = digital.ofdm_rx(**kw)
    if mob:
        tx._impl.set_min_output_buffer(mob)
        rx._impl.set_min_output_buffer(mob)
    return tx, rx


def _feed(post, msgs, received, window: int | None, idle: float = 2.0, limit: float = 120.0):
    """Post msgs, at most ``window`` ahead of what was received (None: all at once); return
    (frames received, seconds from the first post to the last reception)."""
    t0 = time.monotonic()
    sent = last_n = 0
    last_t = t0
    while True:
        now = time.monotonic()
        k = received()
        if k != last_n:
            last_n, last_t = k, now
        stalled = now - last_t > 0.2  # lost frames never come back: do not wait for them
        while sent < len(msgs) and (window is None or sent - k < window or stalled):
            post(msgs[sent])
            sent += 1
            last_t = now
            stalled = False
        if (sent == len(msgs) and now - last_t >= idle) or now - t0 > limit:
            return last_n, max(1e-9, last_t - t0)
        time.sleep(0.002)


# -- 1. stock back-to-back loss ------------------------------------------------------------
def stock_back_to_back_loss(n: int, padding: int) -> dict:
    """Stock ofdm_tx -> ofdm_rx without noise, frames abutting (padding 0) or padded."""
    rng = np.random.default_rng(1)
    data, tags = [], []
    for _ in range(n):
        tags.append(
            gr.tag_utils.python_to_tag(
                (len(data), pmt.intern("packet_len"), pmt.from_long(FRAME), pmt.PMT_NIL)
            )
        )
        data.extend(rng.integers(0, 256, FRAME, dtype=np.uint8).tolist())
    tx, _ = _stock_tx_rx(32768)
    tb = gr.top_block()
    sink = blocks.vector_sink_c()
    src = blocks.vector_source_b(data, False, 1, tags)
    if padding:
        shaper = digital.burst_shaper_cc([], padding, 0, False, "packet_len")
        shaper.set_min_output_buffer(32768)
        tb.connect(src, tx, shaper, sink)
    else:
        tb.connect(src, tx, sink)
    tb.run()
    samples = np.concatenate([np.asarray(sink.data(), np.complex64), np.zeros(5000, np.complex64)])
    _, rx = _stock_tx_rx(32768)
    tb = gr.top_block()
    t2p = pdu.tagged_stream_to_pdu(gr.types.byte_t, "packet_len")
    debug = blocks.message_debug()
    tb.connect(blocks.vector_source_c(samples.tolist(), False), rx, t2p)
    tb.msg_connect(t2p, "pdus", debug, "store")
    tb.run()
    got = debug.num_messages()
    return {"frames": n, "received": got, "loss": (n - got) / n, "padding": padding}


# -- 2. stock loopback raw payload rate ----------------------------------------------------
def stock_loopback_rate(n: int, snr_db: float, mob: int, window: int | None = None) -> dict:
    """PDUs of FRAME bytes through stock ofdm_tx -> channel -> ofdm_rx in one live flowgraph,
    posted all at once (window None) or at most ``window`` frames ahead of the receiver."""
    tx, rx = _stock_tx_rx(mob)
    power = burst_power(PhyConfig(post_padding=0))
    tb = gr.top_block()
    p2s = pdu.pdu_to_tagged_stream(gr.types.byte_t, "packet_len")
    chan = channels.channel_model(_nv(snr_db, power), CFO, 1.0, _taps(), 7, False)
    gate = blocks.tag_gate(gr.sizeof_gr_complex, False)  # as in the stock examples
    t2p = pdu.tagged_stream_to_pdu(gr.types.byte_t, "packet_len")
    debug = blocks.message_debug()
    tb.connect(p2s, tx, chan, gate, rx, t2p)
    tb.msg_connect(t2p, "pdus", debug, "store")
    rng = np.random.default_rng(2)
    msgs = [
        pmt.cons(pmt.make_dict(), _u8(rng.integers(0, 256, FRAME, dtype=np.uint8).tobytes()))
        for _ in range(n)
    ]
    tb.start()
    port = pmt.intern("pdus")
    last_n, dt = _feed(
        lambda m: p2s.to_basic_block()._post(port, m), msgs, debug.num_messages, window
    )
    tb.stop()
    tb.wait()
    return {
        "frames": n,
        "received": last_n,
        "loss": (n - last_n) / n,
        "seconds": dt,
        "payload_bytes_per_s": last_n * FRAME / dt,
        "window": window,
        "min_output_buffer": mob,
    }


# -- 2b. stock chain fed at full speed ----------------------------------------------------
def stock_full_speed(n: int, snr_db: float, mob: int, seed: int = 2) -> dict:
    """The stock chain as a new user runs it: a tagged byte stream of n frames of FRAME bytes
    (vector source, ``packet_len`` tags) -> ``digital.ofdm_tx`` -> channel -> tag gate ->
    ``digital.ofdm_rx`` -> PDUs, no Python in the loop; back-pressure from GNU Radio's buffers
    is the only pacing. One extra frame at the end flushes the receiver (not counted)."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n + 1) * FRAME, dtype=np.uint8)
    tags = [
        gr.tag_utils.python_to_tag(
            (i * FRAME, pmt.intern("packet_len"), pmt.from_long(FRAME), pmt.PMT_NIL)
        )
        for i in range(n + 1)
    ]
    tx, rx = _stock_tx_rx(mob)
    power = burst_power(PhyConfig(post_padding=0))
    tb = gr.top_block()
    src = blocks.vector_source_b(data.tolist(), False, 1, tags)
    chan = channels.channel_model(_nv(snr_db, power), CFO, 1.0, _taps(), seed + 7, False)
    gate = blocks.tag_gate(gr.sizeof_gr_complex, False)
    t2p = pdu.tagged_stream_to_pdu(gr.types.byte_t, "packet_len")
    debug = blocks.message_debug()
    tb.connect(src, tx, chan, gate, rx, t2p)
    tb.msg_connect(t2p, "pdus", debug, "store")
    t0 = time.monotonic()
    c0 = time.process_time()
    th0 = _thread_cpu()
    tb.start()
    last_n, last_t = 0, t0
    # the flowgraph ends by itself when the source is done and its threads exit: keep the
    # last reading of each thread (every 0.1 s)
    th1: dict = {}
    th_at = 0.0
    while True:
        k = debug.num_messages()
        now = time.monotonic()
        if now - th_at > 0.1:
            th1.update(_thread_cpu())
            th_at = now
        if k != last_n:
            last_n, last_t = k, now
        if k >= n or now - last_t > 2.0 or now - t0 > 300:
            break
        time.sleep(0.005)
    th1.update(_thread_cpu())
    tb.stop()
    tb.wait()
    cpu = time.process_time() - c0
    got = min(last_n, n)
    dt = max(1e-9, last_t - t0)
    return {
        "frames": n,
        "received": got,
        "loss": (n - got) / n,
        "seconds": dt,
        # process CPU time (every GNU Radio thread) per MB of payload received: steadier than
        # wall-clock rates on a shared machine
        "cpu_seconds": cpu,
        "cpu_s_per_mb": cpu / max(1e-9, got * FRAME / 1e6),
        "payload_bytes_per_s": got * FRAME / dt,
        "min_output_buffer": mob,
        "fed": "vector_source_b, full speed",
        "thread_cpu_s": _thread_profile(th0, th1),
    }


# -- 3. our goodput ------------------------------------------------------------------------
def our_goodput(
    nbytes: int, snr_db: float, drop_rate: float, seed: int, auth: bool = False, **arq: object
) -> dict:
    """One tensor message of nbytes (fp32, RAW) server -> robot over the OFDM loopback + ARQ;
    ``auth``: both ends hold a link key (every frame tagged and checked, ``require_auth`` on)."""
    rng = np.random.default_rng(seed)
    tensors = {"w": rng.standard_normal(nbytes // 4).astype(np.float32)}
    data = encode_message(Message(type=MessageType.MODEL, tensors=tensors))
    ch = ChannelConfig(snr_db=snr_db, cfo=CFO, taps=MULTIPATH, drop_rate=drop_rate, seed=seed)
    with OfdmLoopbackNetwork(nodes=(0, 1), channel=ch, **arq) as net:
        s, r = net.link(0), net.link(1)
        if auth:
            key = bytes(rng.integers(0, 256, 32, dtype=np.uint8))
            s.set_peer_key(1, key)
            r.set_peer_key(0, key)
            s.set_require_auth(True)
            r.set_require_auth(True)
        time.sleep(0.2)
        t0 = time.monotonic()
        c0 = time.process_time()
        th0 = _thread_cpu()
        res = s.send(1, data, timeout=120)
        got = r.recv(timeout=5)
        dt = time.monotonic() - t0
        cpu = time.process_time() - c0
        th1 = _thread_cpu()
        counters = net.counters()
        stats = s.stats()["arq"]
    ok = res.ok and got is not None and got[1] == data
    return {
        "message_bytes": len(data),
        "tensor_bytes": nbytes,
        "snr_db": snr_db,
        "drop_rate": drop_rate,
        "auth": auth,
        "bit_exact": ok,
        "seconds": dt,
        "goodput_bytes_per_s": len(data) / dt if ok else 0.0,
        "cpu_seconds": cpu,
        "cpu_s_per_mb": cpu / (len(data) / 1e6),
        "frames_sent": res.frames_sent,
        "retransmissions": res.retransmissions,
        "fast_retransmissions": stats["fast_retransmissions"],
        "rto_expiries": stats["rto_expiries"],
        "counters": counters,
        "thread_cpu_s": _thread_profile(th0, th1),
    }


# -- 3b. tail latency under heavy loss ------------------------------------------------------
def _lenet_message(seed: int) -> bytes:
    tensors = lenet_like(seed)
    return encode_message(Message(type=MessageType.MODEL, tensors=tensors))


def _tail_summary(times: list[float], statuses: list[str], extra: dict) -> dict:
    t = np.asarray(times)
    med = float(np.median(t))
    p99 = float(np.percentile(t, 99))
    return {
        "transfers": len(times),
        "delivered_bit_exact": statuses.count("delivered"),
        "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
        "median_s": med,
        "p90_s": float(np.percentile(t, 90)),
        "p99_s": p99,
        "max_s": float(t.max()),
        "p99_over_median": p99 / med,
        # with fewer than 100 transfers the p99 interpolates between the slowest two: read it
        # as the maximum (use --tails 100 or more for a p99 that is one)
        "max_over_median": float(t.max()) / med,
        "seconds": times,
        **extra,
    }


def _tail_transfers(a: Any, b: Any, n: int, seed: int, extra: dict) -> dict:
    """n LeNet messages from node 0 (link ``a``) to node 1 (link ``b``), each timed to delivery."""
    times, statuses, per = [], [], []
    for i in range(n):
        data = _lenet_message(seed * 1000 + i)
        before = a.stats()["arq"]
        t0 = time.monotonic()
        res = a.send(1, data, timeout=120)
        got = b.recv(timeout=10)
        times.append(time.monotonic() - t0)
        ok = res.ok and got is not None and got[1] == data
        statuses.append("delivered" if ok else res.status.value)
        after = a.stats()["arq"]
        # what each transfer cost: which repairs the slow ones needed (timeouts or ACK gaps)
        per.append(
            {
                k: after[k] - before[k]
                for k in ("retransmissions", "fast_retransmissions", "rto_expiries", "tail_copies")
            }
        )
    stats = a.stats()["arq"]
    extra = {**extra, "message_bytes": len(data)}
    extra.update(rto_expiries=stats["rto_expiries"], retransmissions=stats["retransmissions"])
    extra["per_transfer"] = per
    slow = sorted(range(n), key=times.__getitem__)[-max(1, n // 10) :]
    fast = sorted(range(n), key=times.__getitem__)[: n // 2]
    extra["rto_expiries_slowest_10pct_vs_fastest_half"] = [
        float(np.mean([per[i]["rto_expiries"] for i in slow])),
        float(np.mean([per[i]["rto_expiries"] for i in fast])) if fast else 0.0,
    ]
    return _tail_summary(times, statuses, extra)


def tail_memory(n: int, loss: float, seed: int) -> dict:
    """LeNet state dict (fp32) over a MemoryChannel with ``loss`` frame loss both ways, n times."""
    from scaleflu.link import MemoryChannel

    with MemoryChannel(loss=loss, delay=0.002, rate_bytes_per_s=700e3, seed=seed) as ch:
        a, b = ch.attach(0, rate_bytes_per_s=650e3), ch.attach(1)
        return _tail_transfers(a, b, n, seed, {"kind": "memory", "loss": loss})


def tail_ofdm(n: int, drop: float, seed: int, **arq: object) -> dict:
    """LeNet state dict over the OFDM loopback (20 dB, CFO, multipath) with ``drop`` of the
    frames dropped after each receiver (both directions), n transfers on one network."""
    ch = ChannelConfig(snr_db=20.0, cfo=CFO, taps=MULTIPATH, drop_rate=drop, seed=seed)
    with OfdmLoopbackNetwork(nodes=(0, 1), channel=ch, **arq) as net:
        s, r = net.link(0), net.link(1)
        time.sleep(0.2)
        return _tail_transfers(s, r, n, seed, {"kind": "ofdm-loopback", "drop_rate": drop})


# -- 4. FER vs SNR -------------------------------------------------------------------------
def fer_point(snr_db: float, multipath: bool, n: int, seed: int, window: int | None = None) -> dict:
    """Frame error rate (and rate) of ofdm_link_tx -> channel -> ofdm_link_rx, n frames of FRAME
    bytes posted all at once or at most ``window`` ahead of the receiver."""
    phy = PhyConfig()
    power = burst_power(phy)
    tb = gr.top_block()
    tx = ofdm_link_tx(mtu=FRAME)
    rx = ofdm_link_rx(mtu=FRAME)
    taps = _taps() if multipath else [1.0]
    chan = channels.channel_model(_nv(snr_db, power), CFO, 1.0, taps, seed, False)
    debug = blocks.message_debug()
    tb.connect(tx, chan, rx)
    tb.msg_connect(rx, "out", debug, "store")
    rng = np.random.default_rng(seed)
    msgs = []
    for i in range(n):
        meta = pmt.dict_add(pmt.make_dict(), pmt.intern("seq"), pmt.from_long(i))
        meta = pmt.dict_add(meta, pmt.intern("count"), pmt.from_long(n))
        payload = rng.integers(0, 256, max_payload(FRAME), dtype=np.uint8).tobytes()
        msgs.append(pmt.cons(meta, _u8(payload)))
    tb.start()
    port = pmt.intern("in")
    _, dt = _feed(
        lambda m: tx.framer.to_basic_block()._post(port, m), msgs, debug.num_messages, window, 2.0
    )
    tb.stop()
    tb.wait()
    ok = rx.frames_ok()
    return {
        "seconds": dt,
        "frame_bytes_per_s": ok * FRAME / dt,
        "snr_db": snr_db,
        "multipath": multipath,
        "frames": n,
        "ok": ok,
        "fer": 1.0 - ok / n,
        "crc_errors": rx.crc_errors(),
        "headers_rejected": rx.headers_rejected(),
    }


# -- 5. bytes on air per encoding ----------------------------------------------------------
def _on_air(nbytes: int) -> dict:
    mp = max_payload(FRAME)
    frames = max(1, math.ceil(nbytes / mp))
    frame_bytes = nbytes + frames * FRAME_OVERHEAD
    full, rest = divmod(nbytes, mp)
    samples = full * samples_per_frame(FRAME)
    if rest:
        samples += samples_per_frame(rest + FRAME_OVERHEAD)
    return {
        "message_bytes": nbytes,
        "frames": frames,
        "frame_bytes": frame_bytes,
        "samples": samples,
        "seconds_at_5MSps": samples / SAMP_RATE,
    }


def encoding_sizes(model_name: str, changed_fraction: float, seed: int = 0) -> dict:
    """Wire bytes of a model's state dict as fp32, fp16, int8 and int8+delta."""
    import torch

    from scaleflu.fl.models import build_model
    from scaleflu.link.wire import group_bounds, state_dict_to_numpy

    torch.manual_seed(seed)
    model = build_model(model_name, 10, 1, 28)
    ref = state_dict_to_numpy(model.state_dict())
    n_params = int(sum(v.size for v in ref.values()))
    rng = np.random.default_rng(seed)
    # the next global model: a fraction of the parameter groups (G = 8 per tensor) changed
    new = {}
    groups_total = groups_changed = 0
    for k, v in ref.items():
        v2 = v.copy()
        if v.dtype.kind == "f" and v.size:
            b = group_bounds(v.size, 8)
            flat = v2.reshape(-1)
            for g in range(len(b) - 1):
                groups_total += 1
                if rng.random() < changed_fraction:
                    groups_changed += 1
                    seg = flat[b[g] : b[g + 1]]
                    seg += (0.01 * (np.std(v) + 1e-3) * rng.standard_normal(seg.size)).astype(
                        v.dtype
                    )
        new[k] = v2
    msg = Message(type=MessageType.MODEL, tensors=new)
    sizes = {
        "fp32": len(encode_message(msg, Encoding.FP32)),
        "fp16": len(encode_message(msg, Encoding.FP16)),
        "int8": len(encode_message(msg, Encoding.INT8)),
        "int8+delta": len(
            encode_message(
                Message(type=MessageType.DELTA, tensors=new), Encoding.INT8, reference=ref
            )
        ),
    }
    out = {
        "model": model_name,
        "parameters": n_params,
        "changed_group_fraction": groups_changed / max(1, groups_total),
        "encodings": {k: _on_air(v) for k, v in sizes.items()},
    }
    out["fp32_over_int8_delta"] = sizes["fp32"] / sizes["int8+delta"]
    out["fp32_over_int8"] = sizes["fp32"] / sizes["int8"]
    return out


# -- main ----------------------------------------------------------------------------------
def _isolated(fn, *args, **kw):
    """Run one measurement in a fresh process: GNU Radio 3.10 never frees a flowgraph holding a
    hier block with message ports (its SysV shared-memory buffers leak until the process ends,
    and the system allows 4096 segments), so dozens of flowgraphs in one process fail."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *args, **kw).result(timeout=600)


def _plot(res: dict, path: Path) -> None:
    from scaleflu.plots import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for mp, style in ((False, "o-"), (True, "s--")):
        pts = [p for p in res["fer_vs_snr"] if p["multipath"] == mp]
        ax[0].semilogy(
            [p["snr_db"] for p in pts],
            [max(p["fer"], 1e-3) for p in pts],
            style,
            label=f"AWGN + CFO{' + 3-tap multipath' if mp else ''}",
        )
    ax[0].set_xlabel("SNR (dB, over the burst power)")
    ax[0].set_ylabel("frame error rate (floor 1e-3 = no error seen)")
    ax[0].set_title("OFDM link, FFT 64 CP 16, BPSK hdr / QPSK payload, 1500 B frames")
    ax[0].grid(True, which="both", alpha=0.3)
    ax[0].legend()
    names = ["fp32", "fp16", "int8", "int8+delta"]
    width = 0.38
    for i, m in enumerate(res["encodings"]):
        vals = [m["encodings"][n]["frame_bytes"] / 1e6 for n in names]
        x = np.arange(len(names)) + (i - 0.5) * width
        ax[1].bar(x, vals, width, label=f"{m['model']} ({m['parameters']:,} params)")
    ax[1].set_yscale("log")
    ax[1].set_xticks(np.arange(len(names)), names)
    ax[1].set_ylabel("MB on air (frames incl. headers)")
    ax[1].set_title("bytes on air per encoding")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer frames and repetitions")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--message-mb", type=float, default=2.0, help="tensor bytes per transfer")
    ap.add_argument(
        "--goodput-only", action="store_true", help="only the interleaved goodput comparison"
    )
    ap.add_argument(
        "--tails",
        type=int,
        default=0,
        metavar="N",
        help="only the tail-latency check: N LeNet transfers at 40%% loss per back-end (N >= 100)",
    )
    ap.add_argument(
        "--auth",
        action="store_true",
        help="only the cost of link keys: goodput with and without them, interleaved",
    )
    a = ap.parse_args(argv)
    if a.tails:
        return tails_main(a)
    if a.auth:
        return auth_main(a)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    reps = 1 if a.quick else a.reps
    nfr = 150 if a.quick else 400
    nbytes = int((0.5 if a.quick else a.message_mb) * 1e6)
    a.out.mkdir(parents=True, exist_ok=True)
    res: dict = {
        "load_average_start": os.getloadavg(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "gnuradio": gr.version()},
        "phy": {
            "fft_len": 64,
            "cp_len": 16,
            "header": "BPSK",
            "payload": "QPSK",
            "frame_bytes": FRAME,
            "post_padding": PhyConfig().post_padding,
        },
        "channel": {"cfo": CFO, "multipath_taps": [str(t) for t in MULTIPATH]},
    }
    t_all = time.monotonic()

    if not a.goodput_only:
        log.info("stock back-to-back loss")
        res["stock_back_to_back"] = [
            _isolated(stock_back_to_back_loss, nfr * 2, p) for p in (0, 160)
        ]
        log.info("  %s", res["stock_back_to_back"])

    # Interleaved: each repetition measures the stock chain fed at full speed (a vector source
    # into digital.ofdm_tx, no Python in the loop, the same number of payload bytes as our
    # message) and our stack with and without frame loss, alternating which goes first, so a
    # change of machine load hits both alike; ratios are taken per repetition.
    nstock = math.ceil(nbytes / FRAME)
    stock: list[dict] = []
    ours: dict[str, list[dict]] = {"20dB": [], "20dB_5pct_loss": []}
    per_rep = []
    for i in range(reps):
        log.info("repetition %d/%d (load %.1f)", i + 1, reps, os.getloadavg()[0])
        order = ["stock", "20dB", "20dB_5pct_loss"]
        if i % 2:
            order.reverse()
        for what in order:
            if what == "stock":
                stock.append(_isolated(stock_full_speed, nstock, 20.0, 32768, seed=2 + i))
            else:
                drop = 0.05 if what == "20dB_5pct_loss" else 0.0
                ours[what].append(_isolated(our_goodput, nbytes, 20.0, drop, seed=10 + i))
        rep = {
            "stock": stock[-1]["payload_bytes_per_s"],
            "stock_loss": stock[-1]["loss"],
            "ours_20dB": ours["20dB"][-1]["goodput_bytes_per_s"],
            "ours_5pct": ours["20dB_5pct_loss"][-1]["goodput_bytes_per_s"],
            "stock_cpu_s_per_mb": stock[-1]["cpu_s_per_mb"],
            "ours_20dB_cpu_s_per_mb": ours["20dB"][-1]["cpu_s_per_mb"],
            "ours_5pct_cpu_s_per_mb": ours["20dB_5pct_loss"][-1]["cpu_s_per_mb"],
            "order": order,
            "load": os.getloadavg()[0],
        }
        rep["ratio_20dB"] = rep["ours_20dB"] / rep["stock"]
        rep["ratio_5pct"] = rep["ours_5pct"] / rep["stock"]
        per_rep.append(rep)
        log.info("  %s", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in rep.items()})
    res["stock_full_speed_20dB"] = stock
    res["ours"] = ours
    res["per_repetition"] = per_rep
    med = lambda key: statistics.median(r[key] for r in per_rep)  # noqa: E731
    best_stock = med("stock")
    g0, g5 = med("ours_20dB"), med("ours_5pct")
    res["stock_payload_bytes_per_s"] = best_stock
    res["stock_payload_bytes_per_s_range"] = [
        min(r["stock"] for r in per_rep),
        max(r["stock"] for r in per_rep),
    ]
    res["goodput_bytes_per_s"] = {"20dB": g0, "20dB_5pct_loss": g5}
    res["goodput_bytes_per_s_range"] = {
        "20dB": [min(r["ours_20dB"] for r in per_rep), max(r["ours_20dB"] for r in per_rep)],
        "20dB_5pct_loss": [
            min(r["ours_5pct"] for r in per_rep),
            max(r["ours_5pct"] for r in per_rep),
        ],
    }
    res["ratio_vs_stock"] = {"20dB": med("ratio_20dB"), "20dB_5pct_loss": med("ratio_5pct")}
    res["ratio_vs_stock_range"] = {
        "20dB": [min(r["ratio_20dB"] for r in per_rep), max(r["ratio_20dB"] for r in per_rep)],
        "20dB_5pct_loss": [
            min(r["ratio_5pct"] for r in per_rep),
            max(r["ratio_5pct"] for r in per_rep),
        ],
    }
    res["cpu_s_per_mb"] = {
        k: {"median": med(k), "range": [min(r[k] for r in per_rep), max(r[k] for r in per_rep)]}
        for k in ("stock_cpu_s_per_mb", "ours_20dB_cpu_s_per_mb", "ours_5pct_cpu_s_per_mb")
    }
    # where the CPU went, per block type (median over the repetitions; /proc ticks of 10 ms)
    runs = {"stock": stock, "20dB": ours["20dB"], "20dB_5pct_loss": ours["20dB_5pct_loss"]}
    res["thread_cpu_s_median"] = {}
    for what, rs in runs.items():
        names = {k for r in rs for k in r.get("thread_cpu_s", {})}
        med_t = {
            k: statistics.median(r.get("thread_cpu_s", {}).get(k, 0.0) for r in rs) for k in names
        }
        res["thread_cpu_s_median"][what] = dict(sorted(med_t.items(), key=lambda kv: -kv[1])[:25])
    res["targets"] = {
        "20dB >= 0.9 x stock": res["ratio_vs_stock"]["20dB"] >= 0.9,
        "5% loss >= 0.8 x stock": res["ratio_vs_stock"]["20dB_5pct_loss"] >= 0.8,
    }
    if a.goodput_only:
        res["seconds"] = time.monotonic() - t_all
        res["load_average_end"] = os.getloadavg()
        (a.out / "link_goodput.json").write_text(json.dumps(res, indent=2))
        log.info("ratios %s ranges %s", res["ratio_vs_stock"], res["ratio_vs_stock_range"])
        log.info("CPU s per MB %s", res["cpu_s_per_mb"])
        log.info("wrote %s", a.out / "link_goodput.json")
        return 0

    log.info("FER vs SNR")
    snrs = [8, 10, 12, 14, 16, 17, 18, 19, 20, 22, 25, 30]
    res["fer_vs_snr"] = []
    for mp in (False, True):
        for s in snrs:
            p = _isolated(fer_point, s, mp, 100 if a.quick else 200, seed=int(s) + 50 * mp)
            res["fer_vs_snr"].append(p)
            log.info("  snr %s mp %s fer %.3f", s, mp, p["fer"])

    log.info("bytes on air per encoding")
    res["encodings"] = [encoding_sizes("lenet", 0.3), encoding_sizes("resnet18", 0.3)]
    res["encodings_all_changed"] = [encoding_sizes("lenet", 1.0)]
    res["targets"]["int8+delta >= 4x fewer bytes than fp32"] = all(
        m["fp32_over_int8_delta"] >= 4.0 for m in res["encodings"]
    )
    res["seconds"] = time.monotonic() - t_all
    res["load_average_end"] = os.getloadavg()
    (a.out / "link_bench.json").write_text(json.dumps(res, indent=2))
    _plot(res, a.out / "link_bench.png")
    log.info(
        "goodput %.0f / %.0f B/s vs stock %.0f B/s -> %s (ranges %s)",
        g0,
        g5,
        best_stock,
        res["ratio_vs_stock"],
        res["ratio_vs_stock_range"],
    )
    log.info("targets %s", res["targets"])
    log.info("wrote %s", a.out / "link_bench.json")
    return 0


def auth_main(a: argparse.Namespace) -> int:
    """Goodput with link keys (every frame tagged and checked, keyless frames dropped) against
    without, interleaved per repetition (alternating which goes first), at 20 dB with and without
    5 % frame loss; ratios per repetition -> link_auth.json."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    nbytes = int(a.message_mb * 1e6)
    a.out.mkdir(parents=True, exist_ok=True)
    t_all = time.monotonic()
    res: dict = {
        "load_average_start": os.getloadavg(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "gnuradio": gr.version()},
        "tensor_bytes": nbytes,
        "runs": [],
        "per_repetition": [],
    }
    for i in range(a.reps):
        rep: dict = {"load": os.getloadavg()[0]}
        for drop in (0.0, 0.05):
            order = [False, True] if (i + int(drop > 0)) % 2 == 0 else [True, False]
            got = {}
            for auth in order:
                r = _isolated(our_goodput, nbytes, 20.0, drop, seed=10 + i, auth=auth)
                res["runs"].append(r)
                got[auth] = r["goodput_bytes_per_s"]
            name = "5pct_loss" if drop else "20dB"
            rep[name] = {"plain": got[False], "auth": got[True], "ratio": got[True] / got[False]}
        res["per_repetition"].append(rep)
        log.info("repetition %d/%d: %s", i + 1, a.reps, rep)
    res["ratio_auth_over_plain"] = {
        name: {
            "median": statistics.median(r[name]["ratio"] for r in res["per_repetition"]),
            "range": [
                min(r[name]["ratio"] for r in res["per_repetition"]),
                max(r[name]["ratio"] for r in res["per_repetition"]),
            ],
        }
        for name in ("20dB", "5pct_loss")
    }
    res["bit_exact"] = all(r["bit_exact"] for r in res["runs"])
    res["seconds"] = time.monotonic() - t_all
    res["load_average_end"] = os.getloadavg()
    (a.out / "link_auth.json").write_text(json.dumps(res, indent=2))
    log.info("auth / plain goodput %s", res["ratio_auth_over_plain"])
    return 0


def tails_main(a: argparse.Namespace) -> int:
    """Tail latency at 40 % frame loss: p99 <= 3 x median on MemoryChannel and OFDM loopback."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    a.out.mkdir(parents=True, exist_ok=True)
    res: dict = {
        "load_average_start": os.getloadavg(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "gnuradio": gr.version()},
    }
    res["memory_40pct"] = _isolated(tail_memory, a.tails, 0.4, 1)
    log.info(
        "memory: %s",
        {k: v for k, v in res["memory_40pct"].items() if k not in ("seconds", "per_transfer")},
    )
    res["ofdm_40pct"] = _isolated(tail_ofdm, a.tails, 0.4, 1)
    log.info(
        "ofdm: %s",
        {k: v for k, v in res["ofdm_40pct"].items() if k not in ("seconds", "per_transfer")},
    )
    res["targets"] = {
        f"{k}: p99 <= 3 x median": res[k]["p99_over_median"] <= 3.0
        for k in ("memory_40pct", "ofdm_40pct")
    }
    res["load_average_end"] = os.getloadavg()
    (a.out / "link_tails.json").write_text(json.dumps(res, indent=2))
    log.info("targets %s; wrote %s", res["targets"], a.out / "link_tails.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
