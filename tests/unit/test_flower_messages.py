"""pflkit's Flower messages (``pflkit.flower.apps``): a job's or reply's tensors travel packed, as bytes in the
message's one record or, past one of Flower's array chunks, as one array, and come back bit for bit, whatever
their dtypes and shapes; a message's Flower objects (each one a request at every hop of a deployment) stay few
however many tensors it carries."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, RecordDict  # noqa: E402
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402

from pflkit.flower import apps  # noqa: E402
from pflkit.flower.apps import job_content, job_from, packed, reply_content, reply_from, unpacked  # noqa: E402
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


def test_packed_and_unpacked_return_every_tensor_bit_for_bit():
    _same(TENSORS, unpacked(packed(TENSORS)))
    assert unpacked(packed({})) == {}
    out = unpacked(packed(TENSORS))
    out["model.w"] += 1  # fresh and writable, not a view of the message's buffer
    _same(TENSORS, unpacked(packed(TENSORS)))


@pytest.mark.parametrize("one_record", [True, False], ids=["one record", "array record"])
def test_jobs_and_replies_round_trip_through_flower_messages(one_record, monkeypatch):
    if not one_record:  # every message past the one-record size: the tensors go in an ArrayRecord
        monkeypatch.setattr(apps, "ONE_RECORD_MAX", 0)
    job = Job(TENSORS, {"kind": "train", "step": 3, "lr": 0.5, "shared": True})
    content = job_content(job)
    assert list(content) == (["message"] if one_record else ["arrays", "config"])
    back = job_from(SimpleNamespace(content=content))  # what the two read of a Flower Message
    _same(job.arrays, back.arrays)
    assert back.config == job.config and type(back.config["step"]) is int
    reply = Reply({"model.w": TENSORS["model.w"]}, {"loss": 0.5, "seconds": 2})
    back = reply_from(SimpleNamespace(content=reply_content(reply)))
    _same(reply.arrays, back.arrays)
    assert back.metrics == {"loss": 0.5, "seconds": 2.0}


def test_a_message_has_the_same_few_objects_however_many_tensors_it_carries():
    def objects(tensors):
        job = Job(tensors, {"kind": "train"})
        return len(get_all_nested_objects(job_content(job)))  # the message's content, as Flower sends it

    small = [{f"model.p{i}": torch.full((3,), float(i)) for i in range(n)} for n in (1, 20)]
    assert [objects(t) for t in small] == [2, 2]  # RecordDict and its one ConfigRecord (the message is the 3rd)
    chunk = apps.FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE  # Flower's array chunk, 5 MB unless its env variable says
    assert apps.ONE_RECORD_MAX == chunk
    large = {"model.w": torch.zeros(chunk // 4 + 1)}  # packed, past one chunk: an ArrayRecord, cut in 2 chunks
    assert objects(large) == 6  # RecordDict, 2 records, one Array, its two chunks
    unpacked_20 = RecordDict({"arrays": ArrayRecord.from_torch_state_dict(small[1]), "config": ConfigRecord({})})
    assert len(get_all_nested_objects(unpacked_20)) == 43  # what Flower's own ArrayRecord of the 20 would send


def test_a_message_value_may_not_take_the_packed_tensors_key():
    with pytest.raises(ValueError, match="pflkit.tensors"):
        job_content(Job({}, {apps.TENSORS: 1}))


def _raw(header, body: bytes = b"") -> np.ndarray:
    head = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return np.frombuffer(len(head).to_bytes(8, "little") + head + body, np.uint8)


GOOD = packed({"model.w": torch.ones(2, 3)})


@pytest.mark.parametrize("flat, match", [
    (GOOD[:-1], r"tensor 'model.w' float32 \[2, 3\] needs 24 bytes, 23 are left"),
    (np.concatenate([GOOD, GOOD[:4]]), r"4 bytes follow the tensors the header lists"),
    (_raw([["model.w", "complex_garbage", [1]]], b"\0" * 4), r"bad tensor entry \['model.w', 'complex_garbage'"),
    (_raw([["model.w", "float32", [-1]]]), r"bad tensor entry"),
    (_raw([["model.w", "float32", [True]]], b"\0" * 4), r"bad tensor entry"),
    (_raw(b"{not json"), r"the header is not a list of \[name, dtype, shape\]"),
    (_raw([["model.w", "float32"]]), r"the header is not a list of \[name, dtype, shape\]|not enough values"),
    (GOOD[:5], r"at least 8 bytes"),
    (np.frombuffer((10 ** 9).to_bytes(8, "little"), "uint8"), r"the header claims 1000000000 bytes"),
], ids=["truncated", "trailing bytes", "unknown dtype", "negative size", "bool size", "garbled header",
        "short entry", "no length", "header past the end"])
def test_bytes_that_are_not_a_packing_are_refused_saying_why(flat, match):
    with pytest.raises(ValueError, match=match):
        unpacked(flat)


def test_an_unreadable_reply_stops_the_run_naming_its_client_and_node():
    """A reply whose bytes do not unpack is refused as a whole (key ``(message)``) through the server's reply
    check: the pass names client, node, round and pass, as for any other bad reply."""
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

    def transport(jobs):  # client 1's message arrives with its last byte cut off
        messages = []
        for c, job in jobs.items():
            content = reply_content(clients[c].run(job))
            if c == 1:
                record = content["message"]
                record[apps.TENSORS] = record[apps.TENSORS][:-1]
            messages.append(SimpleNamespace(content=content, metadata=SimpleNamespace(src_node_id=700 + c),
                                            has_error=lambda: False))
        return exchange.replies(jobs, messages, 0)

    with pytest.raises(RejectedReply, match=r"round 0, global_model pass: client 1 \(node 701\) sent a reply that "
                                            r"does not answer its job \(pass 0 of the run\): key '\(message\)': "
                                            r"unreadable message: .*needs \d+ bytes"):
        drive(server.evaluate(), transport)
