"""The "why" of the PERM verdicts (experiments.perm.perm_alpha_effects / describe_alpha_effects) on crafted
alphas, computed by hand."""
from types import SimpleNamespace as NS

import torch

from pflkit.experiments import perm as E


def test_alpha_effects_by_hand():
    # 4 clients, groups [0, 0, 1, 1]; Alg. 1 (perm, lr 0.01): alpha with 8 of 16 entries 0, max 0.75
    a1 = torch.tensor([[0.75, 0.25, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5], [0.25, 0, 0, 0.75]])
    # the variant (lr 0.05): uniform alpha, no zeros
    a2 = torch.full((4, 4), 0.25)
    groups = torch.tensor([0, 0, 1, 1])
    states = {("PERM", 0): NS(alpha=a1, data=NS(groups=groups)),
              ("PERM (alpha visits)", 0): NS(alpha=a2, data=NS(groups=groups)),
              ("Local", 0): NS(alpha=None, data=NS(groups=groups))}
    cfg = NS(lr={"perm": 0.01, "perm_alpha": 0.05}, label_groups=2)
    out = E.perm_alpha_effects(NS(states=states), cfg)
    assert out["alpha_zero_fraction"] == {"PERM": 0.5, "PERM (alpha visits)": 0.0}  # 8 of 16 zeros
    assert out["largest_step"] == {"PERM": 0.03, "PERM (alpha visits)": 0.05}  # 0.01 * 0.75 * 4; eta
    # own-group mass per client: 1, 1, 1, 0.75 -> mean 0.9375; uniform alpha: 0.5
    assert out["alpha_own_group_mass"] == {"PERM": 0.9375, "PERM (alpha visits)": 0.5}
    text = E.describe_alpha_effects(out)
    assert ("why (PERM): under Alg. 1's shuffle a visit to client j moves model i by eta * alpha_ij * N: 50% of "
            "alpha is 0 (visits that leave the model where it is) and the largest step is 0.03; alpha's mass on "
            "the client's own label group 0.94") in text
    assert "why (PERM (alpha visits)): visits drawn with probability alpha_ij, every step eta = 0.05 (0% of" in text
    # without label groups there is no own-group line, and without PERM nothing at all
    out = E.perm_alpha_effects(NS(states=states), NS(lr=cfg.lr, label_groups=1))
    assert "alpha_own_group_mass" not in out
    assert E.describe_alpha_effects({}) == ""
