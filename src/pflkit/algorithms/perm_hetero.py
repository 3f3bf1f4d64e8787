"""PERM with heterogeneous client models (Deng et al., Section 3.3), batched on masks.

**Representation.** Every model is stored at the server's full width as stacked params [N, ..]
plus a 0/1 mask of the same shapes (``pflkit.models.width``): client i's sub-model of width r_i is
m_i (.) w. A masked model computes exactly what the small sub-model computes, so all widths run in
one ``vmap`` batch. Training a sub-model is SGD on v -> f(m (.) v): the step is
v <- v - eta * m (.) grad f(m (.) v), which never moves a coordinate outside m
(``engine.local_sgd`` with ``masks``).

**Global model: partial-training FedAvg.** Each round client j receives its sub-model
M_j^t (.) w (extraction ``static`` = HeteroFL, ``rolling`` = FedRolex, ``random``; see
``pflkit.models.width``), takes K masked SGD steps, and the server averages every coordinate over
the clients whose sub-model covers it (coordinates nobody covers keep their value):

    w_c <- sum_j M_jc u_jc / sum_j M_jc.

**Mixing weights (Sec. 3.3).** For every client i,

    min_{a in simplex}  kappa sum_j a_j sqrt(P_j / n_j)                               (complexity)
                      + sum_j a_j ||m_i (.) grad f_i(m_i (.) w) - m_j (.) grad f_j(m_j (.) w)||^2
                      + lambda sum_j a_j^2 / n_j,

with P_j the parameter count of client j's sub-model as the capacity proxy for VC(H_j) and kappa
the configurable constant ``complexity``. The complexity term is linear in a, the same vector
c_j = kappa sqrt(P_j / n_j) for every row i, so the exact solution is
``water_filling(D + c[None, :], n, lambda)`` and the GD solver runs ``projected_gd`` on D + c.
Minimizing, a larger kappa moves each alpha_i's mass *away* from sources with a large
sqrt(P_j / n_j) (big sub-models on few samples) towards small sub-models / many samples.
m_i here is client i's own (static) sub-model, the architecture of its personalized model.

**Shuffling with distinct architectures (the visiting rule).** Personalized model i has width r_i
(static mask m_i: the first units, so widths are nested). When model i visits client j in a
shuffle round, client j can afford only a width-r_j model, so it trains the slice of model i that
fits its budget, m_i AND m_j (= the width-min(r_i, r_j) sub-model of v_i, since static masks are
nested): v_i <- v_i - eta alpha_i(j) N (m_i m_j) (.) grad f_j((m_i m_j) (.) v_i), K times; the
coordinates of v_i outside m_j stay unchanged. Thus (i) no client ever computes with more than its
own budget, (ii) every personalized model keeps its own width, (iii) a large model learns its
extra units only on clients that can hold them, and (iv) with all r = 1 the step is exactly PERM's.
All N models move in one batched call whatever their widths (the width groups are slices of one
stacked tensor).

Everything else (epochs of N shuffle rounds, one shuffle step = one communication round, the
single-loop global step + alpha update every ``update_every`` rounds, warm-up) is PERM's own code:
``PERMHetero`` subclasses ``pflkit.algorithms.perm.PERM`` and supplies the masks and its mixing
weights, and the masked round parts are ``algorithms.round`` with masks; with all budgets 1 and
``complexity=0`` the method is PERM, draw for draw (``test_all_budgets_one_reduces_to_perm``). Masks
of ``random`` extraction come from their own generator stream (seed, round), so they never shift the
training draws.

**Cost per client per round** (tabulated by ``pflkit.experiments.perm_hetero.cost_table``): an
MLP with P parameters costs about P multiply-adds per sample forward, so K local steps on batches of
B cost 6 P B K FLOPs (2 P B forward + 4 P B backward per step); the client holds 4 P bytes of
weights + 4 P bytes of gradients (fp32) and exchanges 4 P bytes each way.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .. import seeds
from ..data.federated import FederatedDataset
from ..engine.full_batch import full_gradients
from ..engine.functional import FunctionalModel
from ..engine.local_sgd import expand_schedule, local_sgd
from ..engine.params import Params, apply_masks, broadcast, flatten
from ..models.width import EXTRACTIONS, WidthSpec, check_fractions, masks_for, num_parameters
from ..checks import check_positive
from .base import BaseState, eval_generator
from .fedavg import FedAvgState, FederatedRound
from .perm import PERM, PERMState, discrepancies, solve_alpha
from .round import MASKED, Pass, PassRound, local_round, mask_extra, masks_of

DISCREPANCIES = ("paper", "shared")


# --------------------------------------------------------------------------- mixing weights
def complexity_costs(sizes: Tensor, n: Tensor) -> Tensor:
    """c_j = sqrt(P_j / n_j): the capacity term per source client (VC(H_j) ~ parameter count P_j)."""
    return torch.sqrt(sizes.double() / n.double().to(sizes.device))


def _draw(data: FederatedDataset, samples: int | None, generator: torch.Generator) -> Tensor | None:
    """The alpha-gradient minibatch rows (``perm.client_gradients``' draw) or None for exact gradients."""
    if samples is None:
        return None
    return data.sample_indices(torch.arange(data.num_clients), samples, generator)


def _client_grads(model: FunctionalModel, w: Params, masks: Params, data: FederatedDataset,
                  idx: Tensor | None) -> Tensor:
    stacked = apply_masks(broadcast(w, data.num_clients), masks)
    if idx is None:
        grads, _ = full_gradients(model, stacked, data)
    else:
        grads, _ = model.batched_grad(stacked, data.x_train[idx], data.y_train[idx])
    return flatten(apply_masks(grads, masks))


def masked_client_gradients(model: FunctionalModel, w: Params, masks: Params, data: FederatedDataset,
                            samples: int | None, generator: torch.Generator) -> Tensor:
    """m_j (.) grad f_j(m_j (.) w) for every client j as rows [N, P] (exact, or from M samples: the
    same draws as ``perm.client_gradients``)."""
    return _client_grads(model, w, masks, data, _draw(data, samples, generator))


def shared_discrepancies(model: FunctionalModel, spec: WidthSpec, fractions: Tensor, w: Params,
                         data: FederatedDataset, samples: int | None, generator: torch.Generator) -> Tensor:
    """D_ij = ||m_ij (.) (grad f_i(m_ij (.) w) - grad f_j(m_ij (.) w))||^2 with m_ij = m_i AND m_j the
    slice both clients hold (static masks: the width-min(r_i, r_j) sub-model) -- the discrepancy of
    exactly the sub-model that model i trains on client j under the visiting rule. One batched
    gradient call per distinct width (client j only ever computes widths <= r_j); one draw of rows."""
    n = data.num_clients
    idx = _draw(data, samples, generator)
    f = torch.as_tensor(fractions, dtype=torch.float64)
    pair = torch.minimum(f[:, None], f[None, :])
    d = torch.zeros(n, n, dtype=torch.float64, device=data.device)
    for r in sorted(set(f.tolist())):
        g = _client_grads(model, w, static_masks(spec, torch.full((n,), r, dtype=torch.float64), data.device),
                          data, idx)
        sel = (pair == r).to(data.device)
        d = torch.where(sel, discrepancies(g), d)
    return d


def hetero_mixing_weights(model: FunctionalModel, w: Params, masks: Params, data: FederatedDataset, lam: float, *,
                          complexity: float = 0.0, solver: str = "exact", steps: int = 100,
                          samples: int | None = None, generator: torch.Generator | None = None,
                          init: Tensor | None = None, discrepancy: str = "paper", spec: WidthSpec | None = None,
                          fractions: Tensor | None = None) -> Tensor:
    """alpha [N, N] of Sec. 3.3 at the global model w with client sub-model masks m_j ([N, ..]).

    ``discrepancy='paper'``: D_ij = ||m_i (.) grad f_i(m_i (.) w) - m_j (.) grad f_j(m_j (.) w)||^2
    (Sec. 3.3 as written); ``'shared'``: on the common slice (``shared_discrepancies``; needs
    ``spec`` and ``fractions``; static masks)."""
    check_positive("complexity", complexity, allow_zero=True)
    if discrepancy not in DISCREPANCIES:
        raise ValueError(f"discrepancy must be one of {DISCREPANCIES}, got {discrepancy!r}")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    if discrepancy == "paper":
        d = discrepancies(masked_client_gradients(model, w, masks, data, samples, gen))
    else:
        if spec is None or fractions is None:
            raise ValueError("discrepancy='shared' needs spec and fractions")
        d = shared_discrepancies(model, spec, fractions, w, data, samples, gen)
    n = data.train_sizes.to(d.device)
    costs = complexity * complexity_costs(num_parameters(masks).to(d.device), n) if complexity else None
    return solve_alpha(d, n, lam, costs, solver=solver, steps=steps, init=init)


def _check_model(model: FunctionalModel, spec: WidthSpec):
    want = spec.shapes
    got = {k: tuple(p.shape) for k, p in model.module.named_parameters()}
    if want != got:
        raise ValueError(f"model parameters {got} do not match the width spec's server model {want}")


def _set_widths(obj, model: FunctionalModel, spec: WidthSpec, fractions: Sequence[float], extraction: str):
    """Check and set the sub-model settings shared by PartialFedAvg and PERMHetero."""
    _check_model(model, spec)
    obj.model, obj.spec = model, spec
    obj.fractions = check_fractions(fractions)
    if extraction not in EXTRACTIONS:
        raise ValueError(f"extraction must be one of {EXTRACTIONS}, got {extraction!r}")
    obj.extraction = extraction


def static_masks(spec: WidthSpec, fractions: Tensor, device) -> Params:
    """The static (first-units) sub-model masks of width ``fractions[i]`` per client."""
    return masks_for(spec, fractions, "static", device=device)


class _WidthMasks:
    """What PartialFedAvg and PERMHetero share about sub-models: the static masks of the clients'
    widths, built once per device and kept on the algorithm object (never in its state; callers must
    not modify them in place), and each round's extraction masks."""

    partial_training = True  # the clients train sub-models of the global model (``round_masks``)

    def personal_masks(self, data: FederatedDataset) -> Params:
        """m_i: client i's static width-r_i sub-model (its personalized model's architecture)."""
        cache = self.__dict__.setdefault("_static_masks", {})
        key = str(data.device)
        if key not in cache:
            cache[key] = static_masks(self.spec, self.fractions, data.device)
        return cache[key]

    def round_masks(self, s: BaseState) -> Params:
        """M_j^t: the sub-models of the global model's partial training this round."""
        if self.extraction == "static":
            return self.personal_masks(s.data)
        return masks_for(self.spec, self.fractions, self.extraction, s.round, mask_generator(s.seed, s.round),
                         s.data.device)


def mask_generator(seed: int, round: int) -> torch.Generator:
    """The stream of ``random`` extraction, separate from the training draws."""
    return torch.Generator().manual_seed(seeds.extraction_masks(seed, round))


# --------------------------------------------------------------------------- partial training baselines
class PartialFedAvg(_WidthMasks, FederatedRound):
    """Partial-training FedAvg (HeteroFL with ``static``, FedRolex with ``rolling`` extraction): the one round
    (``FederatedRound``) with sub-models, every client taking part.

    Client i trains the sub-model of width ``fractions[i]`` each round (``round_masks``); the server averages
    every coordinate over its covering clients (aggregator ``round.MASKED``; the server step is plain averaging,
    ``ServerOpt('gd', 1)``). Personalized model: client i's static width-r_i slice of w, fine-tuned on its own
    training data for ``finetune_steps`` masked SGD steps (0: none). ``fractions`` all equal to r gives FedAvg
    of a width-r model for everyone; all 1, FedAvg's draws (``tests/unit/test_one_round.py``)."""

    client_step = "sub_models"
    client_steps = PassRound.client_steps + ("sub_models", "finetuned_sub_models")
    federated = "its sub-models come from a WidthSpec, which a federated run's spec does not carry"

    def __init__(self, model: FunctionalModel, spec: WidthSpec, *, fractions: Sequence[float], extraction: str,
                 local_steps: int, lr: float, batch_size: int | None, finetune_steps: int = 0,
                 finetune_lr: float | None = None, name: str = "Partial FedAvg"):
        _set_widths(self, model, spec, fractions, extraction)
        self.local_steps = check_positive("local_steps", local_steps, integer=True)
        self.lr = check_positive("lr", lr)
        self.set_round(batch_size=batch_size, clients_per_round=None, aggregator=MASKED)
        self.finetune_steps = check_positive("finetune_steps", finetune_steps, integer=True, allow_zero=True)
        self.finetune_lr = self.lr if finetune_lr is None else check_positive("finetune_lr", finetune_lr)
        self.name = name

    def _check_data(self, data: FederatedDataset):
        if len(self.fractions) != data.num_clients:
            raise ValueError(f"fractions has {len(self.fractions)} entries but the data has "
                             f"{data.num_clients} clients")

    def init(self, data: FederatedDataset, seed: int) -> FedAvgState:
        self._check_data(data)
        return super().init(data, seed)

    def sub_models(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """K masked SGD steps of every listed client's sub-model of w (``extra``'s masks)."""
        return local_round(self.model, w, data, clients, steps=self.local_steps, lr=self.lr,
                           batch_size=self.batch_size, generator=generator, masks=masks_of(extra))

    def finetuned_sub_models(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """Every listed client's static slice of w, fine-tuned for ``finetune_steps`` masked SGD steps."""
        masks = masks_of(extra)
        v = apply_masks(broadcast(w, len(clients)), masks)
        if self.finetune_steps:
            v, _ = local_sgd(self.model, v, data, clients, steps=self.finetune_steps, lr=self.finetune_lr,
                             batch_size=self.batch_size, generator=generator, masks=masks)
        return v

    def personalize_pass(self, s: FedAvgState) -> Pass:
        everyone = torch.arange(s.data.num_clients)
        schedule = expand_schedule(everyone, self.finetune_steps) if self.finetune_steps else None
        return Pass("finetuned_sub_models", everyone, s.w, eval_generator(s), schedule, self.batch_size, shared=True,
                    extra=mask_extra(self.personal_masks(s.data)))


# --------------------------------------------------------------------------- PERM-hetero
class PERMHetero(_WidthMasks, PERM):
    """PERM (single loop / two stage) where client i's personalized model has width ``fractions[i]``.

    Settings as ``pflkit.algorithms.perm.PERM`` plus: ``spec`` (the width-scalable model),
    ``fractions`` (r_i per client), ``extraction`` (how the global model's partial training slices
    it: static / rolling / random), ``complexity`` (kappa of the capacity term; 0 = off) and
    ``discrepancy`` ('paper': Sec. 3.3's D as written; 'shared': on the common slice, see
    ``shared_discrepancies``).
    The round is PERM's with masks: the warm-up is partial-training FedAvg, a shuffle step follows the
    visiting rule, and the global step is partial: w <- w - gamma * (coordinate-wise mean over
    covering clients of M_j (.) grad f_j(M_j (.) w)), ``global_steps`` times, M_j this round's
    extraction. Warm-started alpha updates take ``alpha_steps`` projected-GD steps (the exact solver
    only gives the first alpha)."""

    name = "PERM-hetero"

    def __init__(self, model: FunctionalModel, spec: WidthSpec, *, fractions: Sequence[float],
                 extraction: str = "static", complexity: float = 0.0, discrepancy: str = "paper",
                 name: str | None = None, **perm):
        """``perm``: PERM's settings (:class:`~pflkit.algorithms.perm.PERM`)."""
        _set_widths(self, model, spec, fractions, extraction)
        if discrepancy not in DISCREPANCIES:
            raise ValueError(f"discrepancy must be one of {DISCREPANCIES}, got {discrepancy!r}")
        self.discrepancy = discrepancy
        self.complexity = check_positive("complexity", complexity, allow_zero=True)
        super().__init__(model, **perm)
        if name is not None:
            self.name = name

    federated = "PERM-hetero's alpha update reads every client's masked gradients at several widths in one process"

    def alpha_passes(self, s: PERMState, init: Tensor | None):
        """Sec. 3.3's alpha at the current global model, computed in this process (no pass)."""
        solver = "gd" if init is not None else self.alpha_solver
        return hetero_mixing_weights(self.model, s.w, self.personal_masks(s.data), s.data, self.lam,
                                     complexity=self.complexity, solver=solver, steps=self.alpha_steps,
                                     samples=self.alpha_samples, generator=s.generator, init=init,
                                     discrepancy=self.discrepancy, spec=self.spec, fractions=self.fractions)
        yield

    def init(self, data: FederatedDataset, seed: int) -> PERMState:
        if len(self.fractions) != data.num_clients:
            raise ValueError(f"fractions has {len(self.fractions)} entries but the data has "
                             f"{data.num_clients} clients")
        return super().init(data, seed)
