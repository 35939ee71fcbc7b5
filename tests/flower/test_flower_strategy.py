"""scaleflu.flower: the strategy records and serves, the client's request helper, the checks of
hostile replies, and the same numbers as the runtime (``scaleflu train`` + ``scaleflu
unlearn``) on the same seed and partition.

The apps are the example's (examples/flower_unlearning), driven through InProcessGrid: what
Flower's simulation engine does (a Context per SuperNode, every message through Flower's
protobuf and back) without Ray's actor processes. The real ``flwr run`` of the same app is
recorded by benchmarks/flower_run.py.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg, FedMedian

from scaleflu.config import ConfigError, load_config
from scaleflu.fl.data import FASHION_MNIST_DIR
from scaleflu.fl.history import HistoryStore
from scaleflu.flower import UnlearningStrategy
from scaleflu.flower import client as sfl
from scaleflu.flower.grid import InProcessGrid
from scaleflu.flower.wire import (
    ACKS_KEY,
    IDENTITY_KEY,
    ClientRequest,
    WireError,
    acks_record,
    identity_record,
    read_acks,
    read_identity,
    state_from_arrays,
)
from scaleflu.unlearn.request import RequestError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "flower_unlearning"


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example app's package (examples/flower_unlearning, a Flower app of its own)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import flower_unlearning.client_app
    import flower_unlearning.server_app

    return flower_unlearning


needs_fmnist = pytest.mark.skipif(
    not any(FASHION_MNIST_DIR.glob("train-images-idx3-ubyte*")),
    reason="FashionMNIST not installed in /usr/share/datasets/fashion-mnist",
)

FED = (
    "seed=0 data.num_clients=4 data.train_subset=1200 data.test_subset=400 data.partition=iid "
    "data.poison.backdoor_clients=[1] data.poison.backdoor_fraction=0.3 fl.clients_per_round=3 "
    "fl.local_epochs=1 fl.lr=0.02 fl.momentum=0.5 fl.batch_size=32 fl.trainer=sequential "
    "fl.threads=1"
)
UNLEARN = ["scale.eval.relearn_max_rounds=0", "scale.heal_epochs=5"]
ROUNDS = 2


def _server_context(rc: dict) -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=rc)


# -- the request helper and the wire checks (no training) -----------------------------------------


def _msg_to(node: int, content: RecordDict) -> Message:
    msg = Message(content, dst_node_id=node, message_type="train")
    msg.metadata.__dict__["_message_id"] = "m1"
    msg.metadata.__dict__["_src_node_id"] = 1
    return msg


def test_request_helper_queues_attaches_and_drops_answered_requests() -> None:
    InProcessGrid(ClientApp(), 1)  # sets the process's task identity, as a runtime does
    ctx = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    a = sfl.request_forget(ctx, "class", classes=(3, 5))
    b = sfl.request_forget(ctx, "sample", fraction=0.25)
    assert sfl.request_forget(ctx, "class", classes=(3, 5)) == a  # the same request, once
    assert [r.text for r in sfl.pending_requests(ctx)] == ["class:3,5", "sample:0.25"]
    out = sfl.reply(_msg_to(7, RecordDict()), ctx, RecordDict(), client_id=2)
    ident = read_identity(out.content, "test")
    assert ident.client_id == 2
    assert [(r.request_id, r.text) for r in ident.requests] == [
        (a, "class:3,5"),
        (b, "sample:0.25"),
    ]
    # the server answers request a: it is no longer sent, the answer is kept
    acked = RecordDict({ACKS_KEY: acks_record({a: "queued"})})
    out = sfl.reply(_msg_to(7, acked), ctx, RecordDict(), client_id=2)
    assert [r.request_id for r in read_identity(out.content, "test").requests] == [b]
    assert sfl.answers(ctx) == {a: "queued"}
    # served: asking again is the same request; refused: it may be asked again
    acked = RecordDict({ACKS_KEY: acks_record({a: "served: scale", b: "refused: no"})})
    sfl.reply(_msg_to(7, acked), ctx, RecordDict(), client_id=2)
    assert sfl.request_forget(ctx, "class", classes=(3, 5)) == a
    assert sfl.request_forget(ctx, "sample", fraction=0.25) not in (a, b)
    # bound to the sender's client, never to a client named in the text
    assert ClientRequest(1, "class:3,5").bind(2).text == "class:3,5@2"
    assert ClientRequest(1, "sample:poisoned").bind(0).poisoned_only
    assert ClientRequest(1, "client").bind(4).clients == (4,)
    for bad in ("class:3@2", "client:2", "sample:1.5", "sample:0", "x" * 300, ""):
        with pytest.raises(RequestError):
            ClientRequest(1, bad)
    with pytest.raises(RequestError):
        sfl.request_forget(ctx, "class")  # no classes


def test_wire_checks_refuse_hostile_records() -> None:
    ref = {"w": torch.zeros(2, 3), "n": torch.zeros((), dtype=torch.int64)}
    ok = state_from_arrays(ArrayRecord({"w": torch.ones(2, 3), "n": torch.tensor(4.0)}), ref, "x")
    assert ok["n"].dtype == torch.int64 and int(ok["n"]) == 4
    for arrays, what in (
        ({"w": torch.ones(3, 2), "n": torch.tensor(1)}, "shape"),
        ({"w": torch.ones(2, 3)}, "keys differ"),
        ({"w": torch.full((2, 3), float("nan")), "n": torch.tensor(1)}, "NaN"),
    ):
        with pytest.raises(WireError, match=what):
            state_from_arrays(ArrayRecord(arrays), ref, "node 9")
    with pytest.raises(WireError, match="no 'scaleflu' record"):
        read_identity(RecordDict(), "node 9")
    with pytest.raises(WireError, match="out of range"):
        read_identity(RecordDict({IDENTITY_KEY: identity_record(7)}), "node 9", num_clients=4)
    rec = identity_record(1)
    rec["request-ids"], rec["requests"] = [1, 2], ["client", "class:1@3"]
    ident = read_identity(RecordDict({IDENTITY_KEY: rec}), "node 9")
    assert [r.text for r in ident.requests] == ["client"] and ident.bad_requests[0][0] == 2


def test_record_only_without_a_config(tmp_path: Path) -> None:
    """Any model, no scaleflu config: the rounds are recorded; serving says what it lacks."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    app = ClientApp()
    sfl.add_registration(app, lambda ctx: int(ctx.node_config["partition-id"]))

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        n = int(context.node_config["partition-id"])
        state = msg.content["arrays"].to_torch_state_dict()
        local = {k: v + 0.1 * (n + 1) for k, v in state.items()}
        content = RecordDict(
            {"arrays": ArrayRecord(local), "metrics": MetricRecord({"num-examples": 10 * (n + 1)})}
        )
        return sfl.reply(msg, context, content, client_id=n)

    grid = InProcessGrid(app, 3)
    strategy = UnlearningStrategy(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=3), tmp_path / "run", model=model
    )
    init = ArrayRecord(model.state_dict())
    strategy.start(grid=grid, initial_arrays=init, num_rounds=2)
    h = HistoryStore(tmp_path / "run")
    assert h.rounds() == [1, 2] and h.participants(1) == [0, 1, 2]
    assert h.data_sizes(2) == {0: 10, 1: 20, 2: 30}
    # FedAvg of +0.1, +0.2, +0.3 weighted 1:2:3 = +0.2333 per round; updates kept per client
    w0 = h.global_model(1)["0.weight"]
    assert torch.allclose(h.final_model()["0.weight"], w0 + 2 * 0.7 / 3, atol=1e-6)
    assert torch.allclose(h.client_update(2, 2)["0.weight"], torch.full_like(w0, 0.3), atol=1e-6)
    assert h.group_last_update()[("0.weight", 0)][0] == 2  # AoI: updated in round 2
    h.close()
    with pytest.raises(ConfigError, match="needs the scaleflu config"):
        strategy.serve("client:0")


# -- hostile replies, requests through the rounds, another wrapped strategy ------------------


@needs_fmnist
def test_strategy_leaves_out_hostile_replies_and_answers_requests(
    tmp_path: Path, example: Any
) -> None:
    client_app = example.client_app

    fed = FED.replace("fl.clients_per_round=3", "fl.clients_per_round=4").replace(
        "data.train_subset=1200", "data.train_subset=400"
    )
    rc = {"scaleflu-set": fed}
    base = client_app.app

    app = ClientApp()
    sfl.add_registration(app, lambda ctx: int(ctx.node_config["partition-id"]))
    heard: dict[int, dict[int, str]] = {}

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        n = int(context.node_config["partition-id"])
        t = int(msg.content["config"]["server-round"])
        heard.setdefault(n, {}).update(read_acks(msg.content))
        if n == 0 and t == 1:
            sfl.request_forget(context, "class", classes=(3,))
        out = base(msg, context)  # the example's ClientApp: real local training
        content = out.content
        ident = content[IDENTITY_KEY]
        if n == 0 and t == 1:  # a request about another client's data, smuggled in
            ident["request-ids"] = [*ident["request-ids"], 99]
            ident["requests"] = [*ident["requests"], "class:3@2"]
        if n == 1 and t == 2:  # a diverged model
            arrays = content["arrays"].to_torch_state_dict()
            arrays["fc3.bias"][0] = float("nan")
            content["arrays"] = ArrayRecord(arrays)
        if n == 2:  # an impostor: claims client 0's identity
            ident["client-id"] = 0
        if n == 3 and t == 1:  # a size that is not its partition's
            content["metrics"]["num-examples"] = 5
        return Message(content, reply_to=msg)

    grid = InProcessGrid(app, 4, rc)
    cfg = load_config(None, shlex.split(fed))
    strategy = UnlearningStrategy(
        FedMedian(fraction_evaluate=0.0, min_available_nodes=4),
        tmp_path / "run",
        cfg,
        selection="inner",
        serve_at_end=False,
        evaluate=False,
    )
    result = strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=2)
    h = HistoryStore(tmp_path / "run")
    assert h.participants(1) == [0, 1]  # 2 impersonates, 3 lies about its size
    assert h.participants(2) == [0, 3]  # 1 sent NaN
    final = result.arrays.to_torch_state_dict()
    assert all(torch.equal(final[k], v) for k, v in h.final_model().items())
    nodes = grid.node_ids
    assert "claims client 0" in strategy.refused[1][nodes[2]]
    assert "partition holds" in strategy.refused[1][nodes[3]]
    assert "NaN" in strategy.refused[2][nodes[1]]
    # client 0's own request queued (bound to client 0), the smuggled one refused; both answered
    assert [(q.client, q.request.text) for q in strategy.requests] == [(0, "class:3@0")]
    assert heard[0][1] == "queued" and heard[0][99].startswith("refused")
    assert set(heard[1]) == set(heard[3]) == set()  # answers go to the asking node only
    assert sfl.answers(grid.contexts[nodes[0]]) == {1: "queued"}
    assert sfl.pending_requests(grid.contexts[nodes[0]]) == []
    h.close()
    # a method that fails is reported, not raised: the server stays up, nothing is deployed
    strategy.unlearn_overrides = ("baselines.pga.epochs=-1",)
    served = strategy.serve(strategy.requests[0], methods=["pga"])
    assert "epochs" in served.errors["pga"] and served.deployed is None


# -- the same numbers as the runtime ------------------------------------------------------------


@needs_fmnist
def test_flower_run_gives_the_runtimes_numbers(tmp_path: Path, example: Any) -> None:
    """The example app under the strategy, and ``scaleflu train`` + ``scaleflu unlearn`` on the
    same config: the same models round by round (float noise: Flower aggregates in float32,
    the runtime in float64) and the same unlearning results for SCALE, Retrain, the control."""
    client_app, server_app = example.client_app, example.server_app

    from scaleflu.cli.unlearn import run_unlearn
    from scaleflu.fl.run import train

    rc = {
        "num-server-rounds": ROUNDS,
        "scaleflu-set": FED,
        "unlearn-set": " ".join(UNLEARN),
        "forget-client": 1,
        "forget-request": "client",
        "forget-round": 2,
        "method": "scale",
        "compare": "retrain,finetune",
        "run-dir": str(tmp_path / "flower"),
    }
    grid = InProcessGrid(client_app.app, 4, rc)
    server_app.app(grid, _server_context(rc))

    ours = tmp_path / "ours"
    train(load_config(None, [*shlex.split(FED), f"fl.rounds={ROUNDS}"]), ours, progress=False)
    mine = {}
    for m in ("retrain", "finetune", "scale"):
        out = run_unlearn(
            ours, "client:1", method=m, overrides=UNLEARN, progress=False, evaluate=True
        )
        mine[m] = json.loads((out / "result.json").read_text())

    a, b = HistoryStore(tmp_path / "flower"), HistoryStore(ours)
    assert a.rounds() == b.rounds() == list(range(1, ROUNDS + 1))
    for t in range(1, ROUNDS + 1):  # Theta[t] (Theta[T+1] of the Flower run is the deployed one)
        ga, gb = a.global_model(t), b.global_model(t)
        assert max(float((ga[k] - gb[k]).abs().max()) for k in ga) <= 1e-5
    for t in range(1, ROUNDS + 1):  # the requester's updates were erased when SCALE deployed
        assert a.participants(t) == [n for n in b.participants(t) if n != 1]
    assert a.erased_clients() == {1}
    served = {
        m: json.loads(
            (tmp_path / "flower" / "unlearn" / f"client-1-{m}" / "result.json").read_text()
        )
        for m in mine
    }
    for m, res in mine.items():
        for key in ("test_acc", "ra", "fa", "fa_protocol", "backdoor_asr"):
            assert served[m]["metrics"][key] == pytest.approx(res["metrics"][key], abs=3e-3), (
                m,
                key,
            )
        assert served[m]["cost"]["bytes"] == res["cost"]["bytes"]
        assert served[m]["aoi"]["mean_s"] == pytest.approx(res["aoi"]["mean_s"], rel=1e-6)
    # the requester heard back: queued in the round it asked, served at the end
    assert sfl.answers(grid.contexts[grid.node_ids[1]]) == {1: "served: scale"}
    side = json.loads((tmp_path / "flower" / "unlearn" / "side_by_side.json").read_text())
    assert len(side) == 1  # asked in round 2 and again when collected: served once
    assert side[0]["request"] == "client:1" and side[0]["deployed"] == "scale"
    labels = [r["label"] for r in side[0]["audit"]]
    assert labels == ["Retrain", "Control", "SCALE"]
    assert all(r["AoI_s"] is not None for r in side[0]["audit"])
    # the run's final model is SCALE's
    from scaleflu.fl.integrity import load_model

    scale_model = load_model(
        tmp_path / "flower" / "unlearn" / "client-1-scale" / "model.safetensors"
    )
    assert all(torch.equal(a.final_model()[k], v.float()) for k, v in scale_model.items())
    a.close()
    b.close()
