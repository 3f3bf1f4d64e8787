"""The canary (pflkit.canary): how it cuts a profile's configs, and its verdicts on real stage runs."""
import sys
from pathlib import Path

import pytest
import yaml

from pflkit import canary
from pflkit.config import load_params, resolve_threads, stage_values, validate_stage
from pflkit.paths import project_root

ROOT = project_root()


@pytest.fixture(scope="module")
def params():
    return load_params(ROOT / "params.yaml")


def test_cut_of_the_paper_profile(params):
    """Rounds past PERM's warm-up and first alpha update, one seed, every method, each grid's extremes;
    the model, the lrs, K and the batch size untouched."""
    full = stage_values(params, "perm_fig2", "paper")
    cut = canary.cut_values("perm_fig2", full)
    v = cut.values
    assert full["rounds"] == 300 and v["rounds"] == 25  # warm-up 10 + update_every 10 + 1 = 21 < 25
    assert v["seeds"] == [full["seeds"][0]] and cut.seeds_full == 3
    assert v["methods"] == full["methods"]
    for key in ("model", "lr", "local_steps", "batch_size", "finetune_lr", "perm", "pfedme"):
        assert v[key] == full[key], key
    assert v["num_clients"] == full["num_clients"] == 50  # not cut: 10 clients hid the divergence 50 show
    assert cut.scale == pytest.approx(300 / 25 * 3)
    fewer = canary.cut_values("perm_fig2", full, max_clients=10)  # --max-clients 10
    assert fewer.values["num_clients"] == 10 and fewer.scale == pytest.approx(300 / 25 * 3 * 50 / 10)

    hetero = canary.cut_values("perm_hetero", stage_values(params, "perm_hetero", "paper"))
    assert hetero.values["rounds"] == 20 + 10 + 1  # its warm-up is 20 rounds, updates every 10

    grid = canary.cut_values("charles_fig13", stage_values(params, "charles_fig13", "paper"))
    g = grid.values
    assert g["gammas"] == [0.0, 10.0] and g["etas"] == [0.001, 10.0]
    assert (grid.settings_full, grid.settings_run) == (54, 4)
    assert {t["rounds"] for t in g["tasks"].values()} == {canary.GRID_ROUNDS}
    assert g["tune_window"] == canary.GRID_ROUNDS
    assert g["local_steps"] == 10
    assert g["tasks"]["cifar100"]["width"] == 1.0 and g["tasks"]["cifar100"]["batch_size"] == 20

    short = canary.cut_values("perm_fig2", full, rounds=2, grid_rounds=2)
    assert short.values["rounds"] == 2  # an explicit round count wins over the PERM horizon


def test_canary_params_validate_and_stay_under_build_canary(params):
    cut_params, cuts = canary.canary_params(params, "paper", ["perm_fig4", "perm_fig5", "charles_fig6"])
    target = canary.canary_profile("paper")
    for name in ("perm_fig4", "perm_fig5", "charles_fig6"):
        cfg = validate_stage(cut_params, name, target)
        assert cfg.results_dir == f"build/canary/paper/{name}"
    assert cuts["perm_fig4"].values["alpha_file"] == "build/canary/paper/perm_fig4/models/alpha.npz"
    assert cuts["perm_fig5"].values["alpha_file"] == "build/canary/paper/perm_fig4/models/alpha.npz"
    assert cuts["charles_fig6"].values["eval_samples"] == canary.EVAL_SAMPLES


def test_verdict_texts():
    log = ("stage perm_fig2 failed in cell 7: DivergenceError: Localized FedAvg diverged at round 20 "
           "(seed 0, lr=0.3, finetune_lr=0.3): loss 52.1 > 1e+03 x initial 2.3; lower the learning rate\n")
    assert canary.failure_reason(log, 1).startswith("diverged: Localized FedAvg diverged at round 20 (seed 0, lr=0.3")
    assert canary.failure_reason("stage x failed in cell 3: KeyError: 'a'\n", 1) == "error: KeyError: 'a'"
    assert canary.failure_reason("", -9) == "killed by signal 9"
    assert canary.memory_budget(0, 100) == 100 + canary.MEMORY_FLOOR
    assert canary.memory_budget(2**30, 100, factor=3.0) == 100 + 3 * 2**30


def _params_with(tmp_path: Path, params, lr: dict) -> str:
    p = dict(params)
    p["profiles"] = {**params["profiles"], "smoke": {**params["profiles"]["smoke"],
                                                       "perm_fig1": {**params["profiles"]["smoke"]["perm_fig1"],
                                                                     "lr": lr, "seeds": [0]}}}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p, sort_keys=False))
    return str(path)


@pytest.mark.slow
def test_canary_fails_naming_stage_method_round_and_setting_and_passes_with_the_profile_lrs(tmp_path, params, capsys):
    """A learning rate set to diverge (localized FedAvg at 1e4 on perm_fig1's smoke setting) fails the canary
    with the stage, the method, the round and the learning rates; exit status 1. The profile's own lrs pass.
    One test, the two runs in turn: both write build/canary/smoke/ (its params.yaml, the stage's outputs), so two
    pytest-xdist workers running them at once would race (a failing run read the passing run's params)."""
    lr = {**params["profiles"]["smoke"]["perm_fig1"]["lr"], "localized_fedavg": 1.0e4}
    # 5 rounds: the smoke setting's own, PERM's alpha update due at round 5 (the cross-key rules refuse fewer)
    code = canary.run_canary("smoke", ["perm_fig1"], _params_with(tmp_path / "bad", params, lr), rounds=5)
    err = capsys.readouterr().err
    assert code == 1
    line = next(x for x in err.splitlines() if x.startswith("  perm_fig1: FAILED"))
    assert "diverged: Localized FedAvg diverged at round " in line
    assert "lr=10000.0" in line and "seed 0" in line
    assert (ROOT / "build/canary/smoke/canary.csv").read_text().count("FAILED") == 1

    code = canary.run_canary("smoke", ["perm_fig1"], _params_with(tmp_path / "good", params,
                                                                   params["profiles"]["smoke"]["perm_fig1"]["lr"]),
                             rounds=5)
    out = capsys.readouterr()
    assert code == 0, out.err
    row = next(x for x in out.out.splitlines() if x.startswith("| perm_fig1 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "ok" and cells[2] == "5/5"
    assert float(cells[5]) > 0  # seconds per round, measured
    threads = resolve_threads()  # the estimate names the threads it was measured at (OMP_NUM_THREADS, else 1)
    assert f"whole profile smoke on this machine at {threads} torch thread" in out.out
    md = (ROOT / "build/canary/smoke/canary.md").read_text()  # the same table, with the machine and the command
    assert md.startswith("Machine: ") and "`python -m pflkit reproduce --profile smoke --canary --stages perm_fig1 " \
        "--canary-rounds 5 --params " in md
    assert row in md and f"at {threads} torch thread" in md
    assert "FAILED" not in (ROOT / "build/canary/smoke/canary.csv").read_text()


# ------------------------------------------------------------------------------------------- memory estimates
from pflkit import config as config_module  # noqa: E402
from pflkit.config import ConfigError, network_footprint, stage_config  # noqa: E402
from pflkit.experiments import charles_nn  # noqa: E402

#: peaks measured on the CPU machine the canary runs on (ru_maxrss in MiB above the same process before it built
#: the data; one task, one round per process, torch 1 thread; the substitute fashion-mnist loaded): stage,
#: profile, task, clients per round M, settings G, measured MiB. The paper profile's rows are its canary cut
#: (width 1 models, 2 settings; ``python -m pflkit reproduce --profile paper --canary --short``'s values).
MEASURED = [
    ("charles_fig12", "paper", "shakespeare", 2, 2, 1715),  # char-LSTM 2 x 256, B = 4
    ("charles_fig12", "paper", "shakespeare", 4, 2, 3209),
    ("charles_fig12", "paper", "cifar100", 2, 2, 2716),  # ResNet-18-GN width 1, B = 20
    ("charles_fig12", "paper", "cifar100", 4, 2, 4716),
    ("charles_fig12", "paper", "femnist", 2, 2, 432),  # FEMNIST CNN width 1
    ("charles_fig12", "paper", "femnist", 4, 4, 922),
    ("charles_fig12", "default", "cifar100", 2, 6, 592),
    ("charles_fig12", "default", "shakespeare", 2, 6, 732),
    ("charles_fig12", "default", "femnist", 3, 6, 322),
]
#: whole stages of the paper profile's short canary: peak RSS above its baseline process (MiB), measured
MEASURED_CANARY = [("charles_fig12", 3035), ("charles_fig13", 5435), ("charles_fig6", 1108)]


@pytest.fixture
def substitutes_load(monkeypatch):
    """The machine-independent case: a paper dataset that has a substitute never loads (this machine's: offline)."""
    monkeypatch.setattr(config_module, "image_may_load", lambda name, root="data/raw", allow_download=False: False)


def _grid_config(params, stage, profile, **changes):
    values = dict(stage_values(params, stage, profile))
    tasks = {name: {**t, **changes.pop(name, {})} for name, t in values["tasks"].items()}
    return stage_config(stage)(**{**values, "tasks": tasks, **changes})


def test_network_footprint_of_the_grid_models():
    """Parameters, a row's bytes (input + every layer's output for one sample) and steps, on the meta device."""
    from pflkit.models.femnist import femnist_cnn
    from pflkit.models.lstm import char_lstm
    from pflkit.models.resnet import resnet18_gn
    assert network_footprint(lambda: resnet18_gn((1, 28, 28), 10, 1.0), (1, 28, 28)) == (11_172_810, 4_427_880, 1)
    assert network_footprint(lambda: femnist_cnn((1, 28, 28), 10, 1.0), (1, 28, 28)) == (1_199_882, 546_408, 1)
    # the LSTM's hidden-to-hidden layers run once per character: 80 steps
    assert network_footprint(lambda: char_lstm(90, 8, 256, 2), (80,)) == (820_522, 1_342_400, 80)
    assert network_footprint(lambda: char_lstm(90, 8, 32, 2), (80,))[2] == 80


def test_grid_estimate_grows_with_clients_settings_and_model(params, substitutes_load):
    """charles_fig13 (default profile): every client of a round adds its chunk of models (CLIENT_COPIES copies and
    B rows of activations), every setting SERVER_COPIES server models; the paper's width-1 models dwarf the CPU
    cut's; settings_chunk bounds the client call."""
    base = _grid_config(params, "charles_fig13", "default")
    more_clients = _grid_config(params, "charles_fig13", "default", cifar100={"clients_per_round": 4})
    more_settings = _grid_config(params, "charles_fig13", "default", etas=[0.03, 0.1, 0.3, 1.0])
    wide = _grid_config(params, "charles_fig13", "default", cifar100={"width": 1.0})
    est = {name: cfg.memory_estimate()[0] for name, cfg in
           (("base", base), ("clients", more_clients), ("settings", more_settings), ("wide", wide))}
    assert est["base"] < est["clients"] < est["wide"] and est["base"] < est["settings"]
    # the cifar100 task's ResNet-18-GN x 0.0625 on 1 x 28 x 28 (the substitute), G = 8 settings in one call
    t = base.tasks["cifar100"]
    size, row, steps = network_footprint(*_model_of(t))
    assert (size, steps) == (44_550, 1)
    two, four = (charles_nn.task_memory(t.model_copy(update={"clients_per_round": m}), 8, 8, None, 300)[0].bytes
                 for m in (2, 4))
    per_model = charles_nn.CLIENT_COPIES * size * 4 + t.batch_size * (784 * 4 + 4 * row)
    assert four - two == 8 * 2 * per_model
    # the paper profile: 6 settings x 10 clients of ResNet-18 in one call need more than this 23 GB machine has
    paper = _grid_config(params, "charles_fig12", "paper", settings_chunk=6)
    assert paper.memory_estimate() == (pytest.approx(28.94 * 2**30, rel=0.005), "settings_chunk")
    two = _grid_config(params, "charles_fig12", "paper", settings_chunk=2)
    assert two.memory_estimate() == (pytest.approx(10.75 * 2**30, rel=0.005), "settings_chunk")
    one = _grid_config(params, "charles_fig12", "paper", settings_chunk=1)  # one setting x M per call
    assert one.memory_estimate() == (pytest.approx(6.2 * 2**30, rel=0.005), "tasks.cifar100.clients_per_round")


def _model_of(t):
    factory, _ = charles_nn.task_model(t, (1, 28, 28), 10)
    return factory, (1, 28, 28)


@pytest.mark.parametrize("stage,profile,task,m,g,measured", MEASURED,
                         ids=[f"{s}-{p}-{t}-M{m}-G{g}" for s, p, t, m, g, _ in MEASURED])
def test_grid_estimate_against_measured_peaks(params, substitutes_load, stage, profile, task, m, g, measured):
    """Each task's estimate (``task_memory``) is within 0.9x-1.4x of the peak measured for it."""
    cut, _ = canary.canary_params(params, profile, [stage]) if profile == "paper" else (params, None)
    values = stage_values(cut, stage, canary.canary_profile(profile) if profile == "paper" else profile)
    cfg = stage_config(stage)(**values)
    t = cfg.tasks[task].model_copy(update={"clients_per_round": m})
    # every setting in one call, as measured (the paper profile's settings_chunk was 6 >= G)
    total = charles_nn.task_memory(t, g, g, None, t.eval_samples or cfg.eval_samples)[0].bytes
    assert 0.9 <= total / 2**20 / measured <= 1.4, (total / 2**20, measured)


@pytest.mark.parametrize("stage,measured", MEASURED_CANARY, ids=[s for s, _ in MEASURED_CANARY])
def test_stage_estimate_against_the_canary_peaks(params, substitutes_load, stage, measured):
    """The short canary's cut of the paper profile: the stage's estimate within 0.9x-1.4x of its measured peak
    above the baseline process, so its budget (3 x the estimate) has room and an undercount shows."""
    cut, _ = canary.canary_params(params, "paper", [stage], rounds=canary.SHORT_ROUNDS,
                                  grid_rounds=canary.SHORT_ROUNDS)
    cfg = validate_stage(cut, stage, canary.canary_profile("paper"))
    estimate = cfg.model_copy(update={"settings_chunk": 6}).memory_estimate()[0]  # as measured: 6 >= G settings
    assert 0.9 <= estimate / 2**20 / measured <= 1.4, (estimate / 2**20, measured)


def test_perm_fig2_estimate_counts_data_cnn_and_states(params, substitutes_load):
    """perm_fig2 (paper canary cut: N = 10, K = 20, CNN 32/64/512, all 70,000 substitute images): measured 1080 MiB
    above the baseline; the old estimate (a dense network of the dataset's features, no data) said 264 MiB."""
    # rounds None: the cut runs past PERM's warm-up and first alpha update (the cross-key rules ask it)
    cut, _ = canary.canary_params(params, "paper", ["perm_fig2"], rounds=None, grid_rounds=1, max_clients=10)
    cfg = validate_stage(cut, "perm_fig2", canary.canary_profile("paper"))
    # the measurement predates Ditto in the stage's methods: the methods it ran (Ditto's final states count too)
    measured = cfg.model_copy(update={"methods": [m for m in cfg.methods if m != "ditto"]})
    estimate, key = measured.memory_estimate()
    assert 0.9 <= estimate / 2**20 / 1080 <= 1.4, estimate / 2**20
    assert cfg.memory_estimate()[0] > estimate
    more = measured.model_copy(update={"num_clients": 20})
    assert more.memory_estimate()[0] > estimate


@pytest.mark.parametrize("stage,key", [("charles_fig13", "charles_fig13.settings_chunk"),
                                       ("charles_fig12", "charles_fig12.settings_chunk"),
                                       ("charles_fig6", "charles_fig6.tasks.femnist.pool_size"),
                                       ("perm_fig2", "perm_fig2.num_clients")])
def test_a_grid_that_does_not_fit_is_refused_naming_the_stage(params, monkeypatch, substitutes_load, stage, key):
    """Validation compares the estimate with the memory free now: with 64 MiB free every one is refused, named by
    its stage and the key that drives it (a grid's client call: settings_chunk, unset = all settings in one call,
    is what to lower); with 1 TiB free it passes."""
    monkeypatch.setattr(config_module, "available_memory", lambda: 64 * 2**20)
    with pytest.raises(ConfigError) as info:
        validate_stage(params, stage)
    text = str(info.value)
    assert text.startswith(key) and "the stage would need at least" in text and "0.1 GiB free" in text, text
    monkeypatch.setattr(config_module, "available_memory", lambda: 2**40)
    validate_stage(params, stage)


def test_perm_fig3_estimate_counts_the_full_batch_pass(params, substitutes_load):
    """perm_fig3 (paper profile, which the canary runs uncut): its short canary peaked 945 MiB, 598 MiB above the
    baseline process, against a budget of 1079 MiB from the old estimate (a round's models, no full-batch pass):
    one noisy run from failing. The estimate now counts PERM's full-batch pass and MNIST."""
    estimate = validate_stage(params, "perm_fig3", "paper").memory_estimate()[0]
    assert 0.8 <= estimate / 2**20 / 598 <= 1.4, estimate / 2**20
    assert canary.memory_budget(estimate, 347 * 2**20) > 1.5 * 945 * 2**20


def test_the_short_form_is_ci_s_and_its_command_names_no_extra_option():
    assert canary.command_line("paper", None, None, True, canary.SHORT_MAX_CLIENTS) == \
        "python -m pflkit reproduce --profile paper --canary --short"
    assert canary.command_line("paper", None, None, True, 20).endswith("--short --max-clients 20")
    assert canary.command_line("paper", None, None, False, None) == (
        "python -m pflkit reproduce --profile paper --canary")


def test_a_stage_s_progress_lines_reach_the_terminal_and_everything_reaches_the_log(tmp_path, capsys):
    code = ("import sys; print('[perm_fig1 0.1s] round 1/3', flush=True); print('papermill noise', flush=True); "
            "print('[perm_fig1 0.2s] round 2/3', file=sys.stderr, flush=True); sys.exit(3)")
    log = tmp_path / "stage.log"
    rc, peak = canary.run_logged([sys.executable, "-c", code], log, echo="[perm_fig1 ")
    assert rc == 3 and peak > 0
    assert capsys.readouterr().err == "    [perm_fig1 0.1s] round 1/3\n    [perm_fig1 0.2s] round 2/3\n"
    assert log.read_text() == "[perm_fig1 0.1s] round 1/3\npapermill noise\n[perm_fig1 0.2s] round 2/3\n"


@pytest.mark.parametrize("profile", ["paper", "smoke"])
def test_the_short_cut_of_every_stage_passes_the_cross_key_rules(params, profile):
    """CI's `make canary PROFILE=paper CANARY=--short` cuts every stage to one round: the warm-ups, alpha updates,
    evaluation cadence and Flower's deployment rounds are cut with it (``_fit_to_rounds``), so no stage is refused."""
    from pflkit import stages
    names = [s.name for s in stages.STAGES if not s.is_plot]
    cut, _ = canary.canary_params(params, profile, names, rounds=canary.SHORT_ROUNDS, grid_rounds=canary.SHORT_ROUNDS,
                                  max_clients=canary.SHORT_MAX_CLIENTS)
    for name in names:
        validate_stage(cut, name, canary.canary_profile(profile), machine=False)
