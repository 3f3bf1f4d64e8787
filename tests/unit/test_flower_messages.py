"""pflkit's Flower messages (``pflkit.flower.apps``): a job's or reply's tensors travel packed, as bytes in the
message's one record or, past one of Flower's array chunks, as one array, and come back bit for bit, whatever
their dtypes and shapes; a message's Flower objects (each one a request at every hop of a deployment) stay few
however many tensors it carries."""
from types import SimpleNamespace

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
