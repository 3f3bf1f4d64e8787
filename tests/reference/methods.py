"""Methods added outside pflkit, as a user adds one: each is a few lines on top of the one round
(``algorithms.fedavg.FederatedRound``), defined at a module's top level so that every process of a
federated run can import it (``RunSpec`` names it "reference.methods:<Class>")."""
from dataclasses import replace

import torch

from pflkit.algorithms import FedAvg, ServerOpt


class FedAdam(FedAvg):
    """FedAvg with Adam as the server optimizer (Reddi et al., 2021): a configuration of the round."""

    name = "FedAdam"

    def __init__(self, model, *, local_steps, lr, batch_size, server_lr, clients_per_round=None):
        super().__init__(model, local_steps=local_steps, lr=lr, batch_size=batch_size,
                         clients_per_round=clients_per_round, server_opt=ServerOpt("adam", server_lr))
        self.server_lr = server_lr


class FedClip(FedAvg):
    """FedAvg whose clients clip their model change to l2 norm ``clip`` before sending it (DP-FedAvg's
    client step): a method with a client step of its own."""

    name = "FedClip"
    client_steps = FedAvg.client_steps + ("clipped_models",)

    def __init__(self, model, *, local_steps, lr, batch_size, clip, clients_per_round=None):
        super().__init__(model, local_steps=local_steps, lr=lr, batch_size=batch_size,
                         clients_per_round=clients_per_round)
        self.clip = clip

    def clipped_models(self, w, data, clients, generator, extra):
        delta = {k: v - w[k] for k, v in self.local_models(w, data, clients, generator, extra).items()}
        norm = torch.sqrt(sum((d.flatten(1) ** 2).sum(1) for d in delta.values()))  # [M]
        scale = (self.clip / norm).clamp(max=1.0)
        return {k: w[k] + d * scale.view(-1, *[1] * (d.dim() - 1)) for k, d in delta.items()}

    def client_pass(self, s, clients):
        return replace(super().client_pass(s, clients), step="clipped_models")
