"""A Flower ``Grid`` that delivers messages to ClientApps in this process.

:class:`InProcessGrid` is what Flower's simulation engine does for a ServerApp (a
``Context`` per virtual SuperNode with ``partition-id`` and ``num-partitions`` in its node
config, kept across the run; every message and reply serialised to Flower's protobuf and back,
so a ClientApp never shares objects with the server) without Ray's actor processes: the
ClientApp runs in the caller's thread, one message after another. The tests and
``benchmarks/fl_bench.py`` drive a ServerApp or a strategy through it; ``flwr run`` runs the
same apps in Flower's own engines.

A ClientApp that raises is answered like Flower answers it: a reply carrying an ``Error``
(the server's strategy sees ``has_error()``). ``drop`` lets a test lose the replies of some
nodes in some rounds.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=E0611
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

log = logging.getLogger(__name__)


@dataclass
class GridStats:
    """Messages and bytes (serialised) that crossed the grid."""

    messages_out: int = 0
    messages_in: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    errors: int = 0
    by_round: dict[str, int] = field(default_factory=dict)  # group id -> bytes both ways


class InProcessGrid(Grid):
    """``num_nodes`` virtual SuperNodes running ``client_app`` in this process.

    Node ids are seeded 63-bit numbers (like the SuperLink's), never the partition ids, so a
    strategy cannot mistake one for the other. ``drop(node_id, group_id)``: True loses that
    node's reply (a failed or late client).
    """

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: dict[str, bool | float | int | str] | None = None,
        seed: int = 0,
        run_id: int = 1,
        drop: Callable[[int, str], bool] | None = None,
    ) -> None:
        rng = random.Random(seed)
        ids: list[int] = []
        while len(ids) < num_nodes:
            nid = rng.randrange(2, 2**63)
            if nid not in ids:
                ids.append(nid)
        self.client_app = client_app
        self.node_ids = ids
        self.contexts = {
            nid: Context(
                run_id=run_id,
                node_id=nid,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i, nid in enumerate(ids)
        }
        # the identity Flower's runtime gives a ServerApp process (Message() reads it)
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = (
            1,
            run_id,
            SUPERLINK_NODE_ID,
        )
        self._run: Run | None = Run.create_empty(run_id)
        self._replies: dict[str, Message] = {}
        self.drop = drop
        self.stats = GridStats()

    # -- Grid ------------------------------------------------------------------------------

    def set_run(self, run: Run) -> None:
        """Set the run (kept for ``run``)."""
        self._run = run

    @property
    def run(self) -> Run:
        """The run this grid serves."""
        if self._run is None:
            raise RuntimeError("InProcessGrid: no run set")
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """A new message (Flower deprecates this in favour of ``Message(...)``)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """The virtual SuperNodes' ids."""
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message now; the replies wait for :meth:`pull_messages`."""
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            msg.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            msg.metadata.__dict__["_run_id"] = self.contexts[self.node_ids[0]].run_id
            if msg.metadata.dst_node_id not in self.contexts:
                raise ValueError(f"InProcessGrid: no node {msg.metadata.dst_node_id}")
            ids.append(mid)
            out = self._deliver(msg)
            if out is not None:
                self._replies[mid] = out
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to ``message_ids`` that arrived (each returned once)."""
        return [self._replies.pop(m) for m in list(message_ids) if m in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Deliver every message and return the replies (a dropped node's is missing)."""
        return self.pull_messages(self.push_messages(messages))

    # -- delivery --------------------------------------------------------------------------

    def _wire(self, msg: Message, inbound: bool) -> Message:
        """``msg`` through Flower's protobuf form (bytes counted), as a simulation sends it."""
        raw = message_to_proto(msg).SerializeToString()
        st = self.stats
        if inbound:
            st.messages_in += 1
            st.bytes_in += len(raw)
        else:
            st.messages_out += 1
            st.bytes_out += len(raw)
        gid = msg.metadata.group_id
        st.by_round[gid] = st.by_round.get(gid, 0) + len(raw)
        return message_from_proto(ProtoMessage.FromString(raw))

    def _deliver(self, msg: Message) -> Message | None:
        node = msg.metadata.dst_node_id
        received = self._wire(msg, inbound=False)
        received.metadata.__dict__["_delivered_at"] = str(time.time())
        try:
            out = self.client_app(received, self.contexts[node])
        except Exception as exc:  # the ClientApp failed: Flower answers with an Error
            log.warning("node %d: ClientApp raised %s: %s", node, type(exc).__name__, exc)
            self.stats.errors += 1
            out = Message(
                Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(exc).__name__}: {exc}"),
                reply_to=received,
            )
        if self.drop is not None and self.drop(node, msg.metadata.group_id):
            return None
        return self._wire(out, inbound=True)
