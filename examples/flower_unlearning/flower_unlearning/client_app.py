"""ClientApp: FedAvg's local training, and a request to be forgotten (scaleflu.flower.client)."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_unlearning.task import local_train, partition_size
from scaleflu.flower import client as sfl

app = ClientApp()


def _client(context: Context) -> int:
    return int(context.node_config["partition-id"])


def _maybe_ask(context: Context, server_round: int) -> None:
    """Ask to be forgotten from ``forget-round`` on, when the run config names this client."""
    rc = context.run_config
    if int(rc.get("forget-client", -1)) != _client(context):
        return
    if server_round < int(rc.get("forget-round", 1)):
        return
    kind, _, arg = str(rc.get("forget-request", "client")).partition(":")
    if kind == "class":
        sfl.request_forget(context, "class", classes=[int(c) for c in arg.split(",")])
    elif kind == "sample":
        frac = None if arg == "poisoned" else float(arg)
        sfl.request_forget(context, "sample", fraction=frac, poisoned=arg == "poisoned")
    else:
        sfl.request_forget(context, "client")


sfl.add_registration(
    app,
    _client,
    lambda ctx: partition_size(ctx.run_config, _client(ctx)),
    on_query=lambda phase, t, ctx: _maybe_ask(ctx, t),  # after the last round too
)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train on this client's partition; ask to be forgotten when the run config says so."""
    n = _client(context)
    t = int(msg.content["config"]["server-round"])
    state = msg.content["arrays"].to_torch_state_dict()
    local = local_train(context.run_config, n, state, t)
    _maybe_ask(context, t)
    rc = context.run_config
    size = partition_size(rc, n)
    content = RecordDict(
        {"arrays": ArrayRecord(local), "metrics": MetricRecord({"num-examples": size})}
    )
    return sfl.reply(msg, context, content, client_id=n)
