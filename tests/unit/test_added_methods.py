"""Methods added outside pflkit in a few lines (tests/reference/methods.py) on the one round: FedAdam (a
server optimizer) and FedClip (a client step of its own), each against a plain computation and with the
property that defines it. The same classes run on the federated protocol (test_flower_protocol.py) and on
Flower's simulation engine (tests/integration/test_flower.py)."""
import torch
from reference.methods import FedAdam, FedClip

from pflkit.algorithms import FedAvg, ServerOpt
from pflkit.data import perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.engine.params import flatten
from pflkit.models import logistic

DATA = perm_synthetic(num_clients=4, samples_per_client=30, dim=4, test_fraction=0.3, seed=2)


def _model():
    return FunctionalModel(lambda: logistic((4,), 2))


def test_fedadam_takes_adams_step_from_the_clients_average():
    """Round 1 from zero moments: Adam's bias-corrected step is lr * q / (|q| + eps), q = w - the clients'
    average model (the same draws as FedAvg's round, which returns that average exactly)."""
    model = _model()
    plain = FedAvg(model, local_steps=3, lr=0.3, batch_size=4, clients_per_round=3)
    adam = FedAdam(model, local_steps=3, lr=0.3, batch_size=4, server_lr=0.05, clients_per_round=3)
    s0 = adam.init(DATA, 7)
    avg = plain.round(plain.init(DATA, 7)).w
    s1 = adam.round(s0)
    for k, w in s0.w.items():
        q = w - avg[k]
        torch.testing.assert_close(s1.w[k], w - 0.05 * q / (q.abs() + 1e-8), rtol=1e-5, atol=1e-7)
    assert s1.server["step"] == 1 and adam.server_opt == ServerOpt("adam", 0.05)


def test_fedclip_bounds_every_change_and_is_fedavg_when_nothing_is_clipped():
    """A clip above every client's change is FedAvg (to float rounding of w + (v - w)); a small clip bounds
    the round's change of the server model by the clip (an average of changes of norm <= clip)."""
    model = _model()
    plain = FedAvg(model, local_steps=3, lr=0.3, batch_size=4)
    loose = FedClip(model, local_steps=3, lr=0.3, batch_size=4, clip=1e6)
    tight = FedClip(model, local_steps=3, lr=0.3, batch_size=4, clip=0.01)
    a, b, c = plain.init(DATA, 3), loose.init(DATA, 3), tight.init(DATA, 3)
    for _ in range(4):
        before = flatten({k: v.unsqueeze(0) for k, v in c.w.items()})
        a, b, c = plain.round(a), loose.round(b), tight.round(c)
        change = flatten({k: v.unsqueeze(0) for k, v in c.w.items()}) - before
        assert float(change.norm()) <= 0.01 * (1 + 1e-5)
    for k in a.w:
        torch.testing.assert_close(b.w[k], a.w[k], rtol=1e-6, atol=1e-7)
    plain_change = flatten({k: (a.w[k] - plain.init(DATA, 3).w[k]).unsqueeze(0) for k in a.w})
    assert float(plain_change.norm()) > 4 * 0.01  # the clip did bind
