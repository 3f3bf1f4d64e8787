"""`pflkit validate` rejects bad input (issue 16, items 5-9): each case below is the committed
params.yaml with one change, written to a temp folder beside a copy of dvc.yaml and fed through
``pflkit.__main__.main(["validate", path])``. Every case must exit 1 naming ``stage.key`` in stderr,
show the offending value at most once per line, never double the stage name or fall back to
``stage.<section>``, and print no traceback. The committed params.yaml and every notebook's smoke
parameters must stay valid."""
import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from pflkit.__main__ import main
from pflkit.config import ECHO_LIMIT, load_params, registry

ROOT = Path(__file__).resolve().parents[2]
PARAMS_TEXT = (ROOT / "params.yaml").read_text()
PARAMS = load_params(ROOT / "params.yaml")
STAGES = sorted(registry())


# --------------------------------------------------------------------------- how a case changes params.yaml
def put(stage, dotted, value):
    """Set ``stage.dotted`` (dots into mappings, integers into lists) to ``value``."""
    def change(params):
        *path, last = [int(p) if p.isdigit() else p for p in dotted.split(".")]
        node = params[stage]
        for part in path:
            node = node[part]
        node[last] = value
    return change


def drop(stage, dotted=None):
    """Delete the whole section (and its profile overlays), or the key ``stage.dotted``."""
    def change(params):
        if dotted is None:
            del params[stage]
            for profile in (params.get("profiles") or {}).values():
                profile.pop(stage, None)
            return
        *path, last = dotted.split(".")
        node = params[stage]
        for part in path:
            node = node[part]
        del node[last]
    return change


def whole(stage, value):
    def change(params):
        params[stage] = value
    return change


def text(old, new):
    """Edit the YAML text itself (syntax errors, duplicate keys): ``old`` must occur in params.yaml."""
    assert old in PARAMS_TEXT, old
    return ("text", old, new)


def line_of(snippet: str) -> int:
    return PARAMS_TEXT[: PARAMS_TEXT.index(snippet)].count("\n") + 1


ROUNDS = "  rounds: 100\n"  # perm_fig1's rounds line

# (id, change, text that must appear in stderr (the stage.key), offending value as echoed (or None))
CASES = [
    # --- 5. the file itself: YAML syntax, empty file, missing stage sections
    ("yaml-unclosed-list", text(ROUNDS, "  rounds: [100\n"), f"params.yaml:{line_of(ROUNDS) + 1}:", None),
    ("yaml-tab-indent", text(ROUNDS, "  rounds: 100\n\tbatch: 1\n"), f"params.yaml:{line_of(ROUNDS) + 1}:", None),
    ("yaml-bad-indent", text(ROUNDS, "    rounds: 100\n"), "YAML syntax error", None),
    ("yaml-unclosed-quote", text("alpha_file: models/perm_fig4/alpha.npz\n\nperm_fig5",
                                 "alpha_file: 'models/perm_fig4/alpha.npz\n\nperm_fig5"), "YAML syntax error", None),
    ("yaml-duplicate-key", text(ROUNDS, ROUNDS + "  rounds: 5\n"),
     "YAML error: duplicate key 'rounds' (first given at line", None),
    ("empty-file", ("text", PARAMS_TEXT, ""), "params.yaml: the parameters file is empty", None),
    ("only-comments", ("text", PARAMS_TEXT, "# nothing here\n"), "params.yaml: the parameters file is empty", None),
    ("not-a-mapping", ("text", PARAMS_TEXT, "- perm_fig1\n- perm_fig2\n"), "must be a mapping of sections", None),
    ("deleted-stage-section", drop("perm_fig2"), "perm_fig2: params.yaml has no section 'perm_fig2'", None),
    ("deleted-chayti-section", drop("chayti_fig3"), "chayti_fig3: params.yaml has no section 'chayti_fig3'", None),
    ("deleted-defaults", drop("defaults"), "defaults: params.yaml has no section 'defaults'", None),
    ("empty-stage-section", whole("perm_fig5", None), "perm_fig5: the section must be a mapping", None),
    ("scalar-stage-section", whole("perm_fig1", 5), "perm_fig1: the section must be a mapping", "5"),
    ("runner-key-in-section", put("perm_fig1", "results_dir", "elsewhere"),
     "perm_fig1.results_dir: set by the stage runner", "'elsewhere'"),
    ("unknown-section", whole("perm_fgi2", {"rounds": 1}), "perm_fgi2: unknown section", None),
    ("unknown-key", put("perm_fig1", "roudns", 5), "perm_fig1.roudns: unknown key", None),
    # --- 6. strict types
    ("rounds-true", put("perm_fig1", "rounds", True), "perm_fig1.rounds: Input should be a valid integer", "True"),
    ("seeds-bools", put("perm_fig1", "seeds", [True, False]),
     "perm_fig1.seeds.0: Input should be a valid integer", "True"),
    ("rounds-float", put("perm_fig1", "rounds", 2.5), "perm_fig1.rounds: Input should be a valid integer", "2.5"),
    ("num-clients-string", put("perm_fig1", "num_clients", "50"),
     "perm_fig1.num_clients: Input should be a valid integer", "'50'"),
    ("float-given-bool", put("perm_fig6", "lr", True), "perm_fig6.lr: Input should be a valid number", "True"),
    ("float-given-string", put("chayti_fig2", "sigma", "one"),
     "chayti_fig2.sigma: Input should be a valid number", "'one'"),
    ("bool-given-int", put("perm_fig2", "dataset.allow_download", 1),
     "perm_fig2.dataset.allow_download: Input should be a valid boolean", None),
    ("nested-int-given-float", put("charles_fig12", "tasks.femnist.rounds", 2.5),
     "charles_fig12.tasks.femnist.rounds", "2.5"),
    ("update-every-true", put("perm_fig1", "perm.update_every", True),
     "perm_fig1.perm.update_every: must be an integer >= 1", "True"),
    ("threads-true", put("perm_fig1", "threads", True), "perm_fig1.threads: must be an integer >= 1 or 'auto'", "True"),
    ("panel-float-given-string", put("chayti_fig2", "panels.0.eta_bc", "0.003"),
     "chayti_fig2.panels.0.eta_bc", "'0.003'"),
    ("lr-entry-given-bool", put("perm_fig2", "lr.perm", True),
     "perm_fig2.lr.perm: Input should be a valid number", "True"),
    # --- 7. unknown nested keys
    ("hlda-alpah", put("charles_fig12", "tasks.cifar100.partition.alpah", 0.5),
     "charles_fig12.tasks.cifar100.partition.alpah: unknown option", "0.5"),
    ("dirichlet-alpah", put("perm_fig4", "partition.alpah", 0.5), "perm_fig4.partition.alpah: unknown option", "0.5"),
    ("hetero-partition-alpah", put("perm_hetero", "partition.alpah", 0.5),
     "perm_hetero.partition.alpah: unknown option", "0.5"),
    ("fig6-scheme-alpah", put("perm_fig6", "schemes.1 class per client.alpah", 0.5),
     "perm_fig6.schemes.1 class per client.alpah: unknown option", "0.5"),
    ("femnist-partition-alpah", put("charles_fig13", "tasks.femnist.partition.alpah", 0.5),
     "charles_fig13.tasks.femnist.partition.alpah: unknown option", "0.5"),
    ("dataset-nmae", put("perm_fig2", "dataset.nmae", "mnist"), "perm_fig2.dataset.nmae: unknown key", "'mnist'"),
    ("perm-alpah", put("perm_fig1", "perm.alpah", 0.5), "perm_fig1.perm.alpah: unknown key", "0.5"),
    ("pfedme-lamda", put("perm_fig1", "pfedme.lamda", 20.0), "perm_fig1.pfedme.lamda: unknown key", "20.0"),
    ("perfedavg-alpah", put("perm_fig1", "perfedavg.alpah", 0.5), "perm_fig1.perfedavg.alpah: unknown key", "0.5"),
    ("task-widht", put("charles_fig12", "tasks.femnist.widht", 0.5),
     "charles_fig12.tasks.femnist.widht: unknown key", "0.5"),
    ("panel-unknown", put("chayti_fig2", "panels.0.eta", 0.1), "chayti_fig2.panels.0.eta: unknown key", "0.1"),
    ("claim-tolerence", put("perm_hetero", "claim.tolerence", 0.1), "perm_hetero.claim.tolerence: unknown key", "0.1"),
    ("model-hiden", put("perm_fig2", "model.hiden", [64]), "perm_fig2.model.hiden: unknown key", "[64]"),
    ("shakespeare-partition", put("charles_fig12", "tasks.shakespeare.partition", {"scheme": "iid"}),
     "charles_fig12.tasks.shakespeare.partition: unknown key", "{'scheme': 'iid'}"),
    ("task-substitute-typo", put("charles_fig12", "tasks.femnist.substitute", "fashoin"),
     "charles_fig12.tasks.femnist.substitute: unknown dataset 'fashoin'", "'fashoin'"),
    # --- 8. cross-key and data-dependent checks
    ("tau-min-above-max", put("chayti_fig1", "tau_min", 1000.0),
     "chayti_fig1.tau_min: 1000.0 must be < tau_max", "1000.0"),
    ("k-min-above-max", put("charles_fig1", "k_min", 1.0e7),
     "charles_fig1.k_min: 10000000.0 must be <= k_max", "10000000.0"),
    ("clients-per-round-above-clients", put("charles_fig12", "tasks.femnist.clients_per_round", 500),
     "charles_fig12.tasks.femnist.clients_per_round: 500 exceeds the 100 clients", "500"),
    ("clients-per-round-hlda", put("charles_fig13", "tasks.cifar100.clients_per_round", 101),
     "charles_fig13.tasks.cifar100.clients_per_round: 101 exceeds the 100 clients", "101"),
    ("lr-inf", put("perm_fig1", "lr.perm", float("inf")), "perm_fig1.lr.perm: Input should be a finite number", "inf"),
    ("lr-nan", put("perm_fig6", "lr", float("nan")), "perm_fig6.lr: Input should be a finite number", "nan"),
    ("sigma-inf", put("chayti_fig2", "sigma", float("inf")),
     "chayti_fig2.sigma: Input should be a finite number", "inf"),
    ("k-max-inf", put("charles_fig1", "k_max", float("inf")),
     "charles_fig1.k_max: Input should be a finite number", "inf"),
    ("beta-inf", put("perm_fig4", "partition.beta", float("inf")),
     "perm_fig4.partition.beta: must be a number > 0", "inf"),
    ("num-clients-above-pool", put("perm_hetero", "num_clients", 9000),
     "perm_hetero.num_clients: 9000 clients need >= 2 samples each", "9000"),
    ("num-clients-above-dataset", put("perm_fig6", "num_clients", 3000),
     "perm_fig6.num_clients: 3000 clients need >= 2 samples each", "3000"),
    ("num-clients-above-fig4-pool", put("perm_fig4", "num_clients", 15000),
     "perm_fig4.num_clients: 15000 clients need >= 2 samples each", "15000"),
    ("hlda-num-clients-above-data", put("charles_fig12", "tasks.cifar100.num_clients", 1000),
     "charles_fig12.tasks.cifar100.num_clients: 1000 clients x 100 samples_per_client", None),
    ("femnist-num-clients-above-pool", put("charles_fig6", "tasks.femnist.num_clients", 7000),
     "charles_fig6.tasks.femnist.num_clients: 7000 clients need >= 2 samples each", "7000"),
    ("classes-per-client-above-classes", put("perm_hetero", "partition.classes_per_client", 11),
     "perm_hetero.partition.classes_per_client: 11 exceeds the 10 classes", "11"),
    ("fig6-classes-per-client", put("perm_fig6", "schemes.1 class per client.classes_per_client", 12),
     "perm_fig6.schemes.1 class per client.classes_per_client: 12 exceeds the 10 classes", "12"),
    ("negative-seed-in-seeds", put("perm_fig1", "seeds", [0, -1]),
     "perm_fig1.seeds.1: Input should be greater than or equal to 0", "-1"),
    ("negative-seed", put("perm_fig6", "seed", -3), "perm_fig6.seed: Input should be greater than or equal to 0", "-3"),
    ("negative-charles-seed", put("charles_fig5", "seed", -1),
     "charles_fig5.seed: Input should be greater than or equal to 0", "-1"),
    ("negative-nn-seed", put("charles_fig12", "seed", -1),
     "charles_fig12.seed: Input should be greater than or equal to 0", "-1"),
    ("negative-budget-seed", put("perm_hetero", "budget_seed", -7),
     "perm_hetero.budget_seed: Input should be greater", "-7"),
    ("negative-alpha-convergence-seeds", put("perm_alpha_convergence", "seeds", [-2]),
     "perm_alpha_convergence.seeds.0", "-2"),
    ("negative-hidden", put("perm_fig6", "hidden", [200, -5]),
     "perm_fig6.hidden.1: Input should be greater than or equal to 1", "-5"),
    ("zero-hidden-hetero", put("perm_hetero", "hidden", [0, 200]),
     "perm_hetero.hidden.0: Input should be greater", "0"),
    ("negative-model-hidden", put("perm_fig4", "model.hidden", [-200, 200]), "perm_fig4.model.hidden.0", "-200"),
    ("negative-channels", put("perm_fig2", "model.channels", [8, -16]), "perm_fig2.model.channels.1", "-16"),
    ("negative-lstm-hidden", put("charles_fig12", "tasks.shakespeare.hidden", -32),
     "charles_fig12.tasks.shakespeare.hidden", "-32"),
    ("zero-checkpoint", put("perm_alpha_convergence", "checkpoints", [0, 10]),
     "perm_alpha_convergence.checkpoints.0", None),
    ("negative-dirichlet-beta", put("perm_fig4", "partition.beta", -0.3),
     "perm_fig4.partition.beta: must be a number > 0", "-0.3"),
    ("negative-task-dirichlet-beta", put("charles_fig12", "tasks.femnist.partition.beta", -0.3),
     "charles_fig12.tasks.femnist.partition.beta: must be a number > 0", "-0.3"),
    ("negative-hlda-alpha", put("charles_fig12", "tasks.cifar100.partition.alpha", -0.1),
     "charles_fig12.tasks.cifar100.partition.alpha: must be a number > 0", "-0.1"),
    ("negative-hlda-beta", put("charles_fig13", "tasks.cifar100.partition.beta", -10.0),
     "charles_fig13.tasks.cifar100.partition.beta: must be a number > 0", "-10.0"),
    ("image-task-without-clients", put("charles_fig12", "tasks.femnist.num_clients", None),
     "charles_fig12.tasks.femnist.num_clients: required for the image task", None),
    ("task-key-left-out", drop("charles_fig12", "tasks.femnist.num_clients"),
     "charles_fig12.tasks.femnist.num_clients: Field required", None),
    ("hetero-fewer-clients-than-budgets", put("perm_hetero", "num_clients", 3),
     "perm_hetero.num_clients: 3 is fewer than the 4 budgets", "3"),
    ("theory-mu-above-L", put("charles_theory", "mu", 20.0), "charles_theory.mu: 20.0 must be < L", "20.0"),
    ("simulated-gamma-too-large", put("charles_fig5", "gamma", 0.2),
     "charles_fig5.gamma: 0.2 must be < 1/(L+alpha)", "0.2"),
    ("fig1-gamma-fixed-too-large", put("charles_fig1", "gamma_fixed", 0.05),
     "charles_fig1.gamma_fixed: 0.05 must be < 1/L", "0.05"),
    ("fig6-two-tasks", put("charles_fig6", "tasks.copy", copy.deepcopy(PARAMS["charles_fig6"]["tasks"]["femnist"])),
     "charles_fig6.tasks: Fig. 6 runs one task", None),
    ("repeated-method", put("perm_fig1", "methods", ["perm", "fedavg", "perm"]),
     "perm_fig1.methods: must not repeat", None),
    ("repeated-seed", put("perm_fig2", "seeds", [0, 1, 1]), "perm_fig2.seeds: must not repeat", None),
    # one method registry (experiments.curves.METHODS), each stage naming only its family's keys
    ("curve-stage-names-hetero-method", put("perm_fig1", "methods", ["perm", "heterofl"]),
     "perm_fig1.methods: must be a non-empty list from", "['heterofl']"),
    ("hetero-stage-names-curve-method", put("perm_hetero", "methods", ["perm_hetero", "pfedme"]),
     "perm_hetero.methods: must be a non-empty list from", "['pfedme']"),
    ("curve-lr-names-hetero-method", put("perm_fig1", "lr.heterofl", 0.1), "perm_fig1.lr: lr maps method names",
     "'heterofl'"),
    ("fig3-threads-auto", put("perm_fig3", "threads", "auto"),
     "perm_fig3.threads: Input should be a valid integer", "'auto'"),
    # --- 9. messages: one echo, the key of a cross-key rule, no long echo, no doubled stage name
    ("echo-once-solver", put("perm_fig1", "perm.alpha_solver", "magic"),
     "perm_fig1.perm.alpha_solver: must be one of", "'magic'"),
    ("echo-once-model", put("perm_fig2", "model.name", "magic"), "perm_fig2.model.name: must be one of", "'magic'"),
    ("echo-once-device", put("perm_fig1", "device", "magic"), "perm_fig1.device: must be one of", "'magic'"),
    ("echo-once-server", put("charles_fig2", "server_opts", ["gd", "magic"]), "charles_fig2.server_opts.1", "'magic'"),
    ("cross-key-names-lr", put("perm_fig1", "lr", {"fedavg": 0.1}), "perm_fig1.lr: no value for methods", None),
    ("field-required", drop("perm_fig1", "rounds"), "perm_fig1.rounds: Field required", None),
    ("field-required-section", drop("perm_fig2", "dataset"), "perm_fig2.dataset: Field required", None),
    ("long-unknown-value", put("perm_fig1", "extra_table", list(range(400))),
     "perm_fig1.extra_table: unknown key", None),
]
assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def write_params(folder: Path, change) -> Path:
    if isinstance(change, tuple) and change[0] == "text":
        _, old, new = change
        body = PARAMS_TEXT.replace(old, new, 1)
    else:
        params = copy.deepcopy(PARAMS)
        change(params)
        body = yaml.safe_dump(params, sort_keys=False)
    path = folder / "params.yaml"
    path.write_text(body)
    return path


def run_validate(capsys, *argv) -> tuple[int, str, str]:
    code = main(["validate", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def project(tmp_path):
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    return tmp_path


@pytest.mark.parametrize("change, key, value", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_is_rejected_naming_the_key(project, capsys, change, key, value):
    path = write_params(project, change)
    code, out, err = run_validate(capsys, path)
    assert code == 1, f"accepted:\n{out}{err}"
    assert key in err, err
    assert "Traceback" not in err + out
    assert "<section>" not in err
    for stage in STAGES:
        assert f"{stage}.{stage}" not in err, err
    for line in err.splitlines():
        assert len(line) < 600, f"overlong line: {line[:200]}..."
        if value is not None:
            hits = re.findall(rf"(?<![\w.'-]){re.escape(value)}(?![\w.'])", line)
            assert len(hits) <= 1, f"{value} echoed {len(hits)} times: {line}"
    if value is not None:
        assert any(value in line for line in err.splitlines() if key.split(":")[0] in line), \
            f"{key} does not show the value {value}: {err}"


def test_field_required_does_not_echo_the_section(project, capsys):
    code, _, err = run_validate(capsys, write_params(project, drop("perm_fig1", "rounds")))
    assert code == 1
    assert "perm_fig1.rounds: Field required" in err
    assert "samples_per_client" not in err and "'dim'" not in err  # the rest of the section is not echoed


def test_long_values_are_cut(project, capsys):
    code, _, err = run_validate(capsys, write_params(project, put("perm_fig1", "extra_table", list(range(400)))))
    assert code == 1
    line = next(line for line in err.splitlines() if "extra_table" in line)
    echo = re.search(r"\(value (.*)\); allowed keys: (.*)", line)
    assert echo and echo.group(1).endswith("(1890 characters)") and len(echo.group(1)) <= ECHO_LIMIT + 20
    assert "rounds" in echo.group(2).split(", ") and "results_dir" not in echo.group(2)  # runner keys are not offered


def test_yaml_error_names_file_line_and_problem(project, capsys):
    code, _, err = run_validate(capsys, write_params(project, text(ROUNDS, "  rounds: [100\n")))
    assert code == 1
    first = [line for line in err.splitlines() if "YAML syntax error" in line]
    assert len(first) == 1 and str(project / "params.yaml") in first[0]
    assert re.search(r"params\.yaml:\d+:\d+: YAML syntax error: expected ',' or ']'", first[0])


def test_missing_section_is_found_with_an_explicit_dvc_yaml(tmp_path, capsys):
    path = write_params(tmp_path, drop("perm_fig2"))  # no dvc.yaml beside it
    code, out, _ = run_validate(capsys, path)
    assert code == 0 and "not checked that every stage has a section" in out
    code, _, err = run_validate(capsys, path, "--dvc", ROOT / "dvc.yaml")
    assert code == 1 and "perm_fig2: params.yaml has no section 'perm_fig2'" in err


def test_dvc_stage_that_does_not_list_its_section_is_reported(project, capsys):
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    dvc["stages"]["perm_fig1"]["params"] = ["defaults"]
    (project / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))
    code, _, err = run_validate(capsys, write_params(project, lambda p: None))
    assert code == 1
    assert "perm_fig1: dvc.yaml stage 'perm_fig1' does not list 'perm_fig1' under params" in err


def test_committed_params_validate_with_every_dvc_stage(capsys):
    code, out, err = run_validate(capsys, ROOT / "params.yaml")
    assert code == 0, err
    assert "every stage of" in out
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert stages.pop("claims")["cmd"].startswith("python scripts/claims.py")  # the ledger: no params
    for name, spec in stages.items():
        if name.startswith("data_"):  # a data stage: its data.<key> settings (PERM's synthetic: its consumers')
            assert spec["cmd"] == f"python -m pflkit data {name[5:]}", name
            assert spec["params"] == [f"data.{name[5:]}"] or name == "data_perm_synthetic", name
            continue
        assert spec["cmd"].startswith(f"python -m pflkit stage {name} "), name
        wanted = {"defaults", "figures"} if name.endswith("_plot") else {"defaults", name}
        assert set(spec["params"]) == wanted, name


def test_exponent_floats_read_as_floats(tmp_path):
    """PyYAML reads 1.0e6 as a string (YAML 1.1); params.yaml uses that form, DVC reads it as a float."""
    path = tmp_path / "params.yaml"
    path.write_text("defaults: {}\ncharles_fig1: {k_max: 1.0e6, num_k: 1e2, mu: -2.5E-1, label: '1e6'}\n")
    section = load_params(path)["charles_fig1"]
    assert section == {"k_max": 1e6, "num_k": 100.0, "mu": -0.25, "label": "1e6"}


# --------------------------------------------------------------------------- notebooks' smoke parameters
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.py"))


def smoke_parameters(notebook: Path) -> dict:
    """The globals of the notebook's ``# %% tags=["parameters"]`` cell."""
    cell = re.search(r'^# %% tags=\["parameters"\]\n(.*?)(?=^# %%)', notebook.read_text(), re.S | re.M)
    assert cell, f"{notebook}: no parameters cell"
    namespace: dict = {}
    exec(cell.group(1), namespace)  # noqa: S102 (the project's own notebook)
    return namespace


def test_every_notebook_is_covered():
    assert len(NOTEBOOKS) >= 26
    stages = {smoke_parameters(nb)["stage"] for nb in NOTEBOOKS}
    dvc = set(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    assert stages | {"claims"} == {s for s in dvc if not s.startswith("data_")}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS])
def test_notebook_smoke_parameters_build(notebook):
    import torch
    namespace = smoke_parameters(notebook)
    threads = torch.get_num_threads()
    try:
        cfg = registry()[namespace["stage"]].from_namespace(namespace)
    finally:
        torch.set_num_threads(threads)
    assert cfg.stage == namespace["stage"]


# --------------------------------------------------------------------------- profiles
def test_profile_overlays_replace_keys_and_name_their_outputs():
    """A profile replaces whole keys of the section (a nested mapping is not merged) and writes under
    build/<profile>/; the default profile is the section as written, into results/ and figures/."""
    from pflkit.config import stage_values
    params = load_params(ROOT / "params.yaml")
    default = stage_values(params, "perm_fig1")
    smoke = stage_values(params, "perm_fig1", "smoke")
    overlay = params["profiles"]["smoke"]["perm_fig1"]
    assert default["results_dir"] == "results/perm_fig1" and default["figures_dir"] == "figures/perm"
    assert smoke["results_dir"] == "build/smoke/perm_fig1" and smoke["figures_dir"] == "build/smoke/figures/perm"
    assert smoke["pfedme"] == overlay["pfedme"] and smoke["rounds"] == overlay["rounds"] != default["rounds"]
    assert smoke["device"] == "cpu"
    untouched = [k for k in params["perm_fig1"] if k not in overlay and k != "device"]
    assert untouched and all(smoke[k] == default[k] for k in untouched)


@pytest.mark.parametrize("change, match", [
    (lambda p: p["profiles"].update(tiny={"perm_fig1": {"rounds": 0}}),
     r"profiles\.tiny\.perm_fig1\.rounds: .*greater than or equal to 1"),
    (lambda p: p["profiles"].update(tiny={"perm_fig99": {"rounds": 1}}),
     r"profiles\.tiny\.perm_fig99: not a stage section of params\.yaml"),
    (lambda p: p["profiles"].update(tiny={"perm_fig1": {"results_dir": "x"}}),
     r"profiles\.tiny\.perm_fig1\.results_dir: set by the stage runner"),
    (lambda p: p["profiles"].update(tiny=[1, 2]), r"profiles\.tiny: must be a mapping"),
])
def test_bad_profiles_are_reported_by_validate(change, match):
    from pflkit.config import validate_all
    params = load_params(ROOT / "params.yaml")
    change(params)
    problems = "\n".join(validate_all(params))
    assert re.search(match, problems), problems


def test_unknown_profile_names_the_known_ones():
    from pflkit.config import ConfigError, stage_values
    with pytest.raises(ConfigError,
                       match=r"profile: unknown profile 'paper-ish'; params\.yaml defines \['default', 'smoke'"):
        stage_values(load_params(ROOT / "params.yaml"), "perm_fig1", "paper-ish")


def test_a_notebook_namespace_with_a_profile_reads_params_and_keeps_only_set_overrides(monkeypatch):
    """What every notebook does: from_namespace with stage + profile reads params.yaml (PFLKIT_PARAMS
    when the stage runner sets it); a None in the namespace keeps the file's value."""
    import torch
    from pflkit.config import stage_values
    monkeypatch.setenv("PFLKIT_PARAMS", str(ROOT / "params.yaml"))
    threads = torch.get_num_threads()
    try:
        cfg = registry()["perm_fig1"].from_namespace({"stage": "perm_fig1", "profile": "smoke", "threads": None,
                                                       "results_dir": None, "figures_dir": "elsewhere"})
    finally:
        torch.set_num_threads(threads)
    want = stage_values(load_params(ROOT / "params.yaml"), "perm_fig1", "smoke")
    assert cfg.rounds == want["rounds"] and cfg.results_dir == "build/smoke/perm_fig1"
    assert cfg.figures_dir == "elsewhere"
