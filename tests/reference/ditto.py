"""Reference twin of Ditto (Li et al. 2021, Alg. 1): one client, one step at a time, nn.Module + autograd."""
from __future__ import annotations

import torch

from pflkit.data.federated import FederatedDataset
from .fedavg import sgd_steps
from .perfedavg import average, participants


def ditto(factory, w0: dict, data: FederatedDataset, rounds: int, local_steps: int, lr: float, personal_lr: float,
          lam: float, personal_steps: int, batch_size: int, seed: int, clients_per_round: int | None = None,
          weighting: str = "uniform") -> tuple[dict, list[dict]]:
    """Ditto one client at a time; returns the global model and every client's personal model after ``rounds``.
    Per round, from the run's generator: the participants, then their FedAvg minibatches, then their personal
    minibatches; both updates start from (and the personal one is pulled towards) the round's global model."""
    gen = torch.Generator().manual_seed(seed)
    n = data.num_clients
    w = {k: v.clone() for k, v in w0.items()}
    v = [{k: t.clone() for k, t in w0.items()} for _ in range(n)]
    for _ in range(rounds):
        clients = participants(n, clients_per_round, gen)
        m = len(clients)
        idx = data.sample_indices(torch.tensor(clients).unsqueeze(0).expand(local_steps, m), batch_size, gen)
        locals_ = [sgd_steps(factory, w, data, [c] * local_steps, [lr] * local_steps, idx[:, i])
                   for i, c in enumerate(clients)]
        pidx = data.sample_indices(torch.tensor(clients).unsqueeze(0).expand(personal_steps, m), batch_size, gen)
        for i, c in enumerate(clients):
            v[c] = sgd_steps(factory, v[c], data, [c] * personal_steps, [personal_lr] * personal_steps, pidx[:, i],
                             prox=lam, anchor=w)
        w = average(locals_, data.train_sizes[clients] if weighting == "samples" else None)
    return w, v
