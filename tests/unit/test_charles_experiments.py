"""Charles & Konecny stage configs and figure functions (small grids)."""
import pytest

from stage_params import build

from pflkit.config import ConfigError, registry
from pflkit.experiments import charles

BASE = dict(results_dir="build/test", figures_dir="build/test")


def test_every_charles_stage_is_registered():
    stages = {f"charles_fig{n}" for n in (1, 2, 3, 4, 5, 7, 8, 9, 10)} | {"charles_theory"}
    assert stages <= set(registry())


def test_bad_config_values_are_rejected_with_the_key_named():
    with pytest.raises(ConfigError, match="gamma_fixed"):
        build("charles_fig1", gamma_fixed=0.05, L_values=[5.0, 50.0], **BASE)
    with pytest.raises(ConfigError, match="server_opts"):
        build("charles_fig2", server_opts=["adagrad"], **BASE)
    with pytest.raises(ConfigError, match="gamma"):
        build("charles_fig5", gamma=0.2, **BASE)
    with pytest.raises(ConfigError, match="unknown key"):
        build("charles_fig3", lr=0.1, **BASE)


def test_fig3_alpha_frontiers_lie_on_the_alpha0_frontier():
    r = charles.fig3(build("charles_fig3", num_k=80, **BASE))
    assert float(r.table["distance_to_alpha0_frontier"].max()) < 0.01
    assert r.table["rho_min"].is_monotonic_increasing  # larger alpha cannot reach rho = 0


def test_fig2_heavy_ball_frontier_is_symmetric_and_momentum_orders_the_curves():
    r = charles.fig2(build("charles_fig2", num_k=200, L_values=[10.0], **BASE))
    t = r.table.xs(10.0, level="L")
    assert float(t.loc["heavy-ball", "asymmetry"]) < 0.01 < float(t.loc["no momentum", "asymmetry"])
    d = t["delta_at_rho_0.5"]
    assert d["heavy-ball"] < d["Nesterov"] < d["no momentum"]


def test_fig4_maml_frontier_is_a_subset_of_fedavgs():
    r = charles.fig4(build("charles_fig4", num_k=80, **BASE))
    assert float(r.table["maml_distance_to_fedavg"].max()) < 0.01


def test_simulated_figure_reports_the_cusp_at_the_one_shot_delta():
    cfg = build("charles_fig8", num_k=600, dims=[100], server_opts=["gd", "heavy_ball"], **BASE)
    r = charles.simulated(cfg)
    assert r.metrics["max_cusp_abs_difference"] < 0.02
    assert set(r.frame["method"]) == {"FedAvg (Theta_1:K)", "MAML (Theta_K), d=100"}
