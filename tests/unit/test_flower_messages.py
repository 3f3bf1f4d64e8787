"""pflkit's Flower messages (``pflkit.flower.apps``) are Flower's own records: a job's or reply's tensors travel in
an ``ArrayRecord`` (one ``Array`` each) and its values in a ConfigRecord (a job) or MetricRecord (a reply), and
come back bit for bit, whatever their dtypes and shapes; a message that does not deserialize is refused naming its
client and node (issue 55: no packed bytes, no private Flower constant)."""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict  # noqa: E402

from pflkit.flower import apps  # noqa: E402
from pflkit.flower.apps import job_content, job_from, reply_content, reply_from, tensors_and_values  # noqa: E402
from pflkit.flower.client import Job, Reply  # noqa: E402

TENSORS = {
    "model.w": torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),
    "model.b": torch.tensor([1e-30, -0.0, float("inf"), float("nan")], dtype=torch.float64),
    "draw.rows": torch.tensor([[0, 7], [32767, -1]], dtype=torch.int16),
    "lr": torch.tensor(0.25),
    "empty": torch.zeros(0, 5),
    "mask": torch.tensor([True, False]),
    "transposed": torch.arange(12.0).reshape(4, 3).t(),  # not contiguous
}


def _same(a, b):
    assert list(a) == list(b)
    for k in a:
        assert b[k].dtype == a[k].dtype and b[k].shape == a[k].shape, k
        assert torch.equal(_bits(a[k]), _bits(b[k])), k  # bit for bit, nan included


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_jobs_and_replies_round_trip_through_flower_records():
    job = Job(TENSORS, {"kind": "train", "step": 3, "lr": 0.5, "shared": True})
    content = job_content(job)
    assert list(content) == ["arrays", "config"]
    assert isinstance(content["arrays"], ArrayRecord) and isinstance(content["config"], ConfigRecord)
    assert list(content["arrays"]) == list(TENSORS)  # one Array per tensor, Flower's own layout
    back = job_from(SimpleNamespace(content=content))  # what the two read of a Flower Message
    _same(job.arrays, back.arrays)
    assert back.config == job.config and type(back.config["step"]) is int
    back.arrays["model.w"] += 1  # fresh and writable, not a view of the message's buffer
    _same(job.arrays, job_from(SimpleNamespace(content=content)).arrays)
    reply = Reply({"model.w": TENSORS["model.w"]}, {"loss": 0.5, "seconds": 2})
    content = reply_content(reply)
    assert isinstance(content["metrics"], MetricRecord)
    back = reply_from(SimpleNamespace(content=content))
    _same(reply.arrays, back.arrays)
    assert back.metrics == {"loss": 0.5, "seconds": 2.0}
    assert job_from(SimpleNamespace(content=job_content(Job({}, {"kind": "evaluate"})))).arrays == {}


def _garbled():
    record = ArrayRecord({"model.w": Array.from_numpy_ndarray(torch.ones(2, 3).numpy())})
    record["model.w"].data = record["model.w"].data[:-1]  # its last byte cut off
    return RecordDict({"arrays": record, "metrics": MetricRecord({})})


@pytest.mark.parametrize("content, error", [
    (RecordDict({"metrics": MetricRecord({})}), KeyError),
    (RecordDict({"arrays": ConfigRecord({"a": 1}), "metrics": MetricRecord({})}), TypeError),
    (RecordDict({"arrays": ArrayRecord({})}), KeyError),
    (_garbled(), ValueError),
], ids=["no arrays", "arrays not an ArrayRecord", "no metrics", "garbled array"])
def test_a_message_that_is_not_a_reply_raises_what_the_transport_refuses(content, error):
    with pytest.raises(error):
        tensors_and_values(content, "metrics")


def test_an_unreadable_reply_stops_the_run_naming_its_client_and_node():
    """A reply whose array does not deserialize is refused as a whole (key ``(message)``) through the server's
    reply check: the pass names client, node, round and pass, as for any other bad reply."""
    from pflkit.algorithms import FedAvg
    from pflkit.algorithms.round import drive
    from pflkit.engine import FunctionalModel
    from pflkit.flower.client import FederatedClient
    from pflkit.flower.server import FederatedServer, RejectedReply
    from pflkit.flower.spec import RunSpec
    from pflkit.models import logistic

    data = {"name": "perm_synthetic", "kwargs": dict(num_clients=2, samples_per_client=10, dim=3, test_fraction=0.3,
                                                     seed=0)}
    alg = FedAvg(FunctionalModel(lambda: logistic((3,), 2)), local_steps=1, lr=0.1, batch_size=2)
    spec = RunSpec.for_algorithm(alg, model={"name": "logistic"}, data=data, seed=0, rounds=1)
    clients = [FederatedClient(spec, j) for j in range(2)]
    server = FederatedServer(spec, [{**c.info(), "node": 700 + j} for j, c in enumerate(clients)])
    exchange = apps.Exchange({0: 700, 1: 701}, spec.timeout)

    def transport(jobs):  # client 1's message arrives with the last byte of one array cut off
        messages = []
        for c, job in jobs.items():
            content = reply_content(clients[c].run(job))
            if c == 1:
                array = next(iter(content["arrays"].values()))
                array.data = array.data[:-1]
            messages.append(SimpleNamespace(content=content, metadata=SimpleNamespace(src_node_id=700 + c),
                                            has_error=lambda: False))
        return exchange.replies(jobs, messages, 0)

    with pytest.raises(RejectedReply, match=r"round 0, global_model pass: client 1 \(node 701\) sent a reply that "
                                            r"does not answer its job \(pass 0 of the run\): key '\(message\)': "
                                            r"unreadable message: "):
        drive(server.evaluate(), transport)
