"""Records every attribute of every imported ``flwr`` module, runs pflkit's methods on Flower's simulation engine
(its ServerApp in this process) and on a local deployment, and prints as JSON the attributes that changed: none,
since pflkit uses Flower's public API only and patches nothing (issue 55).

    python tests/integration/flower_untouched.py WORKDIR

The modules recorded are Flower's public packages and every module they import, and the modules of Flower's
SuperLink, SuperNode and object transfer that pflkit once patched. Used by tests/integration/test_flower.py.
"""
import importlib
import json
import sys

PUBLIC = ["flwr.app", "flwr.clientapp", "flwr.serverapp", "flwr.serverapp.strategy", "flwr.simulation"]
ONCE_PATCHED = ["flwr.superlink.grid.http_grid", "flwr.supernode.start_client_internal",
                "flwr.supercore.inflatable.inflatable_utils", "flwr.common.constant", "flwr.supernode.cli",
                "flwr.supercore.superexec.run_superexec"]


def attributes() -> dict[str, dict[str, int]]:
    """{module: {attribute: id of its value}} of every flwr module imported now, and the functions, methods and
    properties of the classes it defines (``Class.attribute``; not their data: Flower keeps state there, e.g. the
    simulation's ``TaskIdentity``)."""
    out = {}
    for name, module in sorted(sys.modules.items()):
        if not (name == "flwr" or name.startswith("flwr.")) or module is None:
            continue
        attrs = {k: id(v) for k, v in vars(module).items()}
        for k, v in vars(module).items():
            if isinstance(v, type) and v.__module__ == name:
                attrs.update({f"{k}.{a}": id(x) for a, x in vars(v).items() if callable(x) or isinstance(
                    x, (staticmethod, classmethod, property))})
        out[name] = attrs
    return out


def main(workdir: str) -> None:
    for name in PUBLIC + ONCE_PATCHED:
        importlib.import_module(name)
    before = attributes()
    from pflkit.flower.deployment import deploy
    from pflkit.flower.simulation import simulate
    from pflkit.flower.spec import RunSpec

    data = {"name": "perm_synthetic", "kwargs": dict(num_clients=2, samples_per_client=20, dim=3, test_fraction=0.25,
                                                     seed=0)}
    spec = RunSpec("FedAvg", {"local_steps": 2, "lr": 0.1, "batch_size": 4}, {"name": "logistic"}, data, 0, 1)
    runs = [simulate([spec], num_cpus=1, object_store_mb=128), deploy([spec], workdir=workdir)]
    assert all(len(r["runs"][0]["round_seconds"]) == 1 for r in runs), runs
    after = attributes()
    changed = sorted(f"{m}.{k}" for m, attrs in before.items() for k, ident in attrs.items()
                     if after.get(m, {}).get(k) != ident)
    print(json.dumps({"modules": len(before), "attributes": sum(map(len, before.values())), "changed": changed}))


if __name__ == "__main__":
    main(sys.argv[1])
