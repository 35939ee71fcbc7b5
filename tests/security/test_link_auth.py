"""Authenticated link control by default: the testbed's links answer no keyless frame (no ACK,
NACK or RESET) and hold none of it, and unauthenticated senders together pin at most
``reassembly_max_bytes_untrusted`` (16 MiB) of reassembly memory in any endpoint, however many
they are, while an authenticated peer's large message still goes through."""

from __future__ import annotations

import secrets

import pytest

from scaleflu.config import load_config
from scaleflu.link import MemoryChannel
from scaleflu.link.arq import ArqEndpoint, SendStatus, encode_tagged_frame
from scaleflu.link.frame import BROADCAST, FrameType, encode_frame
from scaleflu.link.sim import SimNetwork
from scaleflu.testbed.keys import KeyStore
from scaleflu.testbed.protocol import SERVER_ID

pytestmark = pytest.mark.timeout(300)

MIB = 1024 * 1024
BOUND = 16 * MIB  # ArqConfig.reassembly_max_bytes_untrusted, the stated bound
OUTSIDER = 77


def _untrusted(ra) -> int:
    """Bytes the reassembler reserves for unauthenticated partial messages."""
    return sum(p.nbytes for p in ra._partials.values() if not p.trusted)


def _first_fragments(src: int, dst: int, msg_id: int, count: int) -> list[bytes]:
    """The first two fragments of a ``count``-fragment message: enough to reserve all of it."""
    body = secrets.token_bytes(1474)
    return [encode_frame(FrameType.DATA, src, dst, msg_id, s, count, body) for s in (0, 1)]


def _keyless_flood(dst: int, senders: int = 64, per_sender: int = 8) -> list[bytes]:
    """Partial messages of 4.2 MB each from ``senders`` keyless nodes (unicast and broadcast),
    complete one-frame messages, and forged ACKs / NACKs."""
    frames = []
    for s in range(100, 100 + senders):
        for m in range(per_sender):
            frames += _first_fragments(s, dst if m % 2 else BROADCAST, m, 3000)
        frames.append(encode_frame(FrameType.DATA, s, dst, 999, 0, 1, b"hello"))
        frames.append(encode_frame(FrameType.ACK, s, dst, 5, 0, 1, b"\x01" + bytes(10)))
        frames.append(encode_frame(FrameType.NACK, s, dst, 5, 0, 1, b"\x03\x00\x00\x00\x01"))
    return frames


def test_the_edge_server_by_default_answers_no_keyless_frame_and_holds_none_of_it(tmp_path):
    from scaleflu.testbed.server import EdgeServer

    cfg = load_config(
        None, ["data.num_clients=2", "fl.clients_per_round=2", "data.train_subset=400",
               "data.test_subset=100"],
    )  # fmt: skip
    store = KeyStore.create([1, 2])
    with MemoryChannel() as ch:
        link = ch.attach(SERVER_ID)
        server = EdgeServer(link, store.robots, cfg, tmp_path, False, signing_key=store.signing_key)
        ep = link.endpoint
        sent: list[bytes] = []
        ep.transmit = sent.append  # every frame the server would put on the air
        for raw in _keyless_flood(SERVER_ID):
            link.feed(raw)
        link.feed(encode_frame(FrameType.DATA, 1, SERVER_ID, 7, 0, 1, b"no tag"))  # robot 1's id
        ep.poll()
        assert sent == []  # no ACK, NACK (RESET) or anything else in answer
        assert ep.stats.acks_tx == ep.stats.nacks_tx == 0
        assert ep.reassembler.bytes_in_flight == 0 and ep.reassembler.messages_in_flight == 0
        assert link.recv(0.1) is None  # nothing delivered to the server's parser
        assert ep.stats.unauthenticated > 0 and ep.stats.auth_failures == 1
        # a robot's authenticated frame is still answered
        key = ep._keys[1]
        link.feed(encode_tagged_frame(key, FrameType.DATA, 1, SERVER_ID, 8, 0, 2, b"x" * 1000))
        ep.poll()
        assert ep.reassembler.messages_in_flight == 1
        server.history.close()


def test_a_robot_holds_at_most_the_bound_of_broadcasts_claiming_to_be_the_server():
    from scaleflu.testbed.robot import RobotClient, RobotData

    cfg = load_config(None, ["data.num_clients=2", "fl.clients_per_round=2",
                             "data.train_subset=400", "data.test_subset=100"])  # fmt: skip
    store = KeyStore.create([1, 2])
    with MemoryChannel() as ch:
        link = ch.attach(1)
        RobotClient(link, 1, store.robots[1], cfg, data=RobotData(cfg, 1))
        ra = link.endpoint.reassembler
        for raw in _keyless_flood(1, senders=8):  # keyless ids: dropped, broadcasts too
            link.feed(raw)
        assert ra.bytes_in_flight == 0
        # broadcasts carry no tag: a node may claim the server's id; they stay in the bound
        for m in range(64):
            for raw in _first_fragments(SERVER_ID, BROADCAST, 1000 + m, 3000):
                link.feed(raw)
            assert _untrusted(ra) <= BOUND and ra.bytes_in_flight <= BOUND
        assert _untrusted(ra) > BOUND // 2  # they were held, within the bound


def test_64_keyless_senders_pin_at_most_16_mib_and_a_keyed_peers_large_message_goes_through():
    """A bare endpoint (require_auth off, as a link without keys runs): the keyless flood is
    reassembled, but within the bound; before, 64 senders reserved about 280 MB."""
    key = secrets.token_bytes(32)
    net = SimNetwork(seed=1)
    a = net.add_endpoint(1)
    b = net.add_endpoint(2)
    a.set_peer_key(2, key)
    b.set_peer_key(1, key)
    big = secrets.token_bytes(20 * MIB)  # larger than the untrusted bound: trusted, not capped
    h = a.send(2, big, deadline=600)
    peak = 0
    for i, raw in enumerate(_keyless_flood(2)):
        b.on_frame(raw)
        peak = max(peak, _untrusted(b.reassembler))
        if i % 2:
            net.step()
    assert peak <= BOUND
    assert _untrusted(b.reassembler) <= BOUND
    assert net.run_until(h.done, max_time=600)
    assert h.status is SendStatus.DELIVERED and (1, big) in net.inbox[2]


def test_untrusted_bound_holds_on_a_bare_endpoint_fed_directly():
    out: list[bytes] = []
    ep = ArqEndpoint(2, out.append)
    for raw in _keyless_flood(2):
        ep.on_frame(raw)
        assert ep.reassembler.bytes_in_flight <= BOUND
    # a message larger than the bound from a keyless sender is refused outright
    before = ep.reassembler.stats.rejected
    for raw in _first_fragments(300, 2, 1, 20000):  # 29 MB
        ep.on_frame(raw)
    assert ep.reassembler.stats.rejected > before and ep.reassembler.messages_in_flight <= 32
    assert ep.reassembler.bytes_in_flight <= BOUND


def test_the_server_warns_when_its_model_is_larger_than_robots_hold_of_broadcasts(tmp_path, caplog):
    """Broadcasts carry no link tag, so robots hold them within the untrusted budget: a model
    larger than that would fall back to unicast, and the operator is told the setting."""
    from scaleflu.testbed.server import EdgeServer

    store = KeyStore.create([1, 2])
    for budget, warned in ((100_000, True), (None, False)):  # LeNet-5: about 250 kB
        extra = [] if budget is None else [f"testbed.arq.reassembly_max_bytes_untrusted={budget}"]
        cfg = load_config(
            None, ["data.num_clients=2", "fl.clients_per_round=2", "data.train_subset=400",
                   "data.test_subset=100", *extra],
        )  # fmt: skip
        caplog.clear()
        with MemoryChannel() as ch:
            link = ch.attach(SERVER_ID)
            link.broadcast = lambda *a, **k: None  # a link that can broadcast (a MAC link)
            run = tmp_path / str(budget)
            server = EdgeServer(link, store.robots, cfg, run, False, signing_key=store.signing_key)
            server.history.close()
        said = [
            r.getMessage()
            for r in caplog.records
            if "reassembly_max_bytes_untrusted" in r.getMessage()
        ]
        assert bool(said) is warned, said
