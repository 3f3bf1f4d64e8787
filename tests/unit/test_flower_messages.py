"""pflkit's Flower messages (``pflkit.flower.apps``): a job's or reply's tensors travel packed in one array,
and come back bit for bit, whatever their dtypes and shapes; a message's Flower objects (each one a request
at every hop of a deployment) stay few however many tensors it carries."""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, RecordDict  # noqa: E402
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402

from pflkit.flower.apps import job_content, job_from, pack, reply_content, reply_from, unpack  # noqa: E402
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


def test_pack_and_unpack_return_every_tensor_bit_for_bit():
    _same(TENSORS, unpack(pack(TENSORS)))
    assert unpack(pack({})) == {}
    out = unpack(pack(TENSORS))
    out["model.w"] += 1  # fresh and writable, not a view of the message's buffer
    _same(TENSORS, unpack(pack(TENSORS)))


def test_jobs_and_replies_round_trip_through_flower_messages():
    job = Job(TENSORS, {"kind": "train", "step": 3})
    back = job_from(SimpleNamespace(content=job_content(job)))  # what the two read of a Flower Message
    _same(job.arrays, back.arrays)
    assert back.config == job.config
    reply = Reply({"model.w": TENSORS["model.w"]}, {"loss": 0.5})
    back = reply_from(SimpleNamespace(content=reply_content(reply)))
    _same(reply.arrays, back.arrays)
    assert back.metrics == {"loss": 0.5}


def test_a_message_has_the_same_few_objects_however_many_tensors_it_carries():
    def objects(n):
        job = Job({f"model.p{i}": torch.full((3,), float(i)) for i in range(n)}, {"kind": "train"})
        return len(get_all_nested_objects(job_content(job)))  # the message's content, as Flower sends it

    assert objects(1) == objects(20) == 5  # RecordDict, 2 records, one Array, its one chunk
    tensors = {f"model.p{i}": torch.full((3,), float(i)) for i in range(20)}
    unpacked = RecordDict({"arrays": ArrayRecord.from_torch_state_dict(tensors), "config": ConfigRecord({})})
    assert len(get_all_nested_objects(unpacked)) == 43  # what Flower's own ArrayRecord of the 20 would send
