"""What a federated run is, as plain JSON every process can rebuild it from: the method (an algorithm
class and its constructor settings), the model, the data builder and the run (seed, rounds, cadence).

The server and every client build the same algorithm object from it (``RunSpec.algorithm``), so the
settings a run uses are the class's own (``settings_of`` reads them back from an algorithm object,
and ``RunSpec.for_algorithm`` checks they rebuild it).
"""
from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import asdict, dataclass, field

from ..checks import check_int, is_real
from ..divergence import DIVERGE_FACTOR
from .. import algorithms
from ..algorithms.server_opt import ServerOpt
from ..data.federated import BATCH_ORDERS, FederatedDataset
from ..data.synthetic import perm_synthetic
from ..engine.functional import FunctionalModel
from ..models import MODELS, build
from ..theory.surrogate import Theta

#: the algorithm classes a federated engine knows by name: every method class ``pflkit.algorithms`` exports (one
#: written as passes); any other method is named by its import path ("package.module:Class", every process of a
#: run imports it). A class runs only where its ``federated`` is True; otherwise that attribute says why it cannot.
METHODS: dict[str, type] = {name: cls for name in algorithms.__all__
                            if isinstance(cls := getattr(algorithms, name), type) and hasattr(cls, "round_passes")}
#: setting values that are objects, as plain JSON ({"<type>": its fields}) and back
_VALUE_TYPES = {"ServerOpt": ServerOpt, "Theta": Theta}


def method_class(method: str) -> type:
    """The class a spec's ``method`` names: a key of ``METHODS`` or an import path "module:Class"."""
    if method in METHODS:
        return METHODS[method]
    module, _, name = method.partition(":")
    if not (module and name):
        raise ValueError(f"method must be one of {sorted(METHODS)} or an import path 'package.module:Class', "
                         f"got {method!r}")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"method {method!r} cannot be imported here: {exc}") from None
    if not hasattr(cls, "round_passes"):
        raise ValueError(f"method {method!r} is not written as passes (algorithms.round.PassRound)")
    return cls


def method_name(cls: type) -> str:
    """How a spec names ``cls``: its key in ``METHODS``, else its import path."""
    if METHODS.get(cls.__name__) is cls:
        return cls.__name__
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise ValueError(f"a federated engine runs the classes of {sorted(METHODS)} or a class every process can "
                         f"import (defined at a module's top level), got {cls.__qualname__} in {cls.__module__}")
    return f"{cls.__module__}:{cls.__qualname__}"


def refusal(cls: type) -> str | None:
    """Why a federated engine cannot run ``cls`` (None: it can)."""
    reason = getattr(cls, "federated", False)
    if reason is True:
        return None
    return reason or f"{cls.__name__} is not written as passes"


def _to_json(value):
    for name, klass in _VALUE_TYPES.items():
        if isinstance(value, klass):
            return {name: {f: _to_json(getattr(value, f)) for f in klass.__dataclass_fields__}}
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    return value


def _from_json(value):
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in _VALUE_TYPES:
        name, fields_ = next(iter(value.items()))
        klass = _VALUE_TYPES[name]
        return klass(**{f: tuple(v) if isinstance(v, list) else v for f, v in fields_.items()})
    return value
#: the data builders a client can rebuild its partition with (keyword arguments from the spec)
DATASETS = {"perm_synthetic": perm_synthetic}


def settings_of(algorithm) -> dict:
    """The constructor keywords of ``algorithm``'s class (and of the bases its ``**kwargs`` reach), read back
    from the object's attributes of the same names (every method class stores its settings so)."""
    names: list[str] = []
    for klass in type(algorithm).__mro__:
        if "__init__" not in vars(klass):
            continue
        more = False
        for p in list(inspect.signature(klass.__init__).parameters.values())[1:]:
            if p.kind is p.VAR_KEYWORD:
                more = True
            elif p.kind is not p.VAR_POSITIONAL and p.name != "model" and p.name not in names:
                names.append(p.name)
        if not more:
            break
    missing = [n for n in names if not hasattr(algorithm, n)]
    if missing:
        raise ValueError(f"{type(algorithm).__name__} does not keep its settings {missing} as attributes")
    return {n: _to_json(getattr(algorithm, n)) for n in names}


@dataclass(frozen=True)
class RunSpec:
    """One federated run. ``method``: a key of ``METHODS`` or an import path; ``settings``: its class's keywords;
    ``model``: ``{"name": one of models.MODELS, "kwargs": {..}}``; ``data``: ``{"name": a key of DATASETS,
    "kwargs": {..}}`` (the builder's arguments, its seed included); ``timeout``: seconds the server waits
    for the replies of one pass before it stops the run with an error naming the silent clients, or (with
    ``min_clients``, for a method that ``tolerates_missing``) goes on without them while at least
    ``min_clients`` of the pass's clients answered (a client that missed a pass is sent nothing after);
    ``label``: the method's name in results (default: the class's ``name``); ``diverge_factor``: the divergence
    rule's factor (``pflkit.divergence``, as ``runner.run``'s; None: no loss-growth check, non-finite values
    still stop the run)."""

    method: str
    settings: dict
    model: dict
    data: dict
    seed: int
    rounds: int
    eval_every: int = 1
    batch_order: str = "replacement"
    timeout: float = 120.0
    label: str = ""
    min_clients: int | None = None
    extra: dict = field(default_factory=dict)  # free-form (e.g. a fault to inject in tests); not read here
    diverge_factor: float | None = DIVERGE_FACTOR

    def __post_init__(self):
        why = refusal(method_class(self.method))
        if why:
            raise ValueError(f"a federated engine cannot run {self.method}: {why}")
        if self.model.get("name") not in MODELS:
            raise ValueError(f"model.name must be one of {MODELS}, got {self.model.get('name')!r}")
        if self.data.get("name") not in DATASETS:
            raise ValueError(f"data.name must be one of {sorted(DATASETS)}, got {self.data.get('name')!r}")
        if self.batch_order not in BATCH_ORDERS:
            raise ValueError(f"batch_order must be one of {BATCH_ORDERS}, got {self.batch_order!r}")
        for name in ("seed", "rounds", "eval_every"):
            check_int(name, getattr(self, name), 0 if name == "seed" else 1)
        if not is_real(self.timeout) or not self.timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {self.timeout!r}")
        factor = self.diverge_factor
        if factor is not None and (not is_real(factor) or not 1 < factor < float("inf")):
            raise ValueError(f"diverge_factor must be None (no loss-growth check) or a finite number > 1, "
                             f"got {factor!r}")
        if self.min_clients is not None:
            check_int("min_clients", self.min_clients, 1, "None (every client) or an integer >= 1")
            if not method_class(self.method).tolerates_missing:
                raise ValueError(f"min_clients must be None for {self.method}: its rounds need every client's "
                                 "output (it does not declare tolerates_missing)")

    # ------------------------------------------------------------------ building
    @classmethod
    def for_algorithm(cls, algorithm, *, model: dict, data: dict, seed: int, rounds: int, **run) -> "RunSpec":
        """The spec of ``algorithm`` (an object of a ``METHODS`` class): its settings, checked to rebuild it."""
        method = method_name(type(algorithm))
        spec = cls(method, settings_of(algorithm), model, data, seed, rounds, **{"label": algorithm.name, **run})
        spec.to_json()  # plain JSON values only
        return spec

    def federation(self) -> FederatedDataset:
        """The whole federation (a client without its own partition file rebuilds it and keeps its partition)."""
        return DATASETS[self.data["name"]](**self.data.get("kwargs", {})).with_batch_order(self.batch_order)

    def federation_key(self) -> str:
        """What names the federation (its data and batch order): a partition file written for another one is
        refused."""
        return json.dumps({"data": self.data, "batch_order": self.batch_order}, sort_keys=True)

    def functional_model(self, feature_shape: tuple[int, ...], num_classes: int) -> FunctionalModel:
        name, kwargs = self.model["name"], dict(self.model.get("kwargs", {}))
        return FunctionalModel(lambda: build(name, tuple(feature_shape), int(num_classes), **kwargs), "cpu")

    def algorithm(self, model: FunctionalModel):
        return method_class(self.method)(model, **{k: _from_json(v) for k, v in self.settings.items()})

    @property
    def name(self) -> str:
        return self.label or self.method

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        return cls(**json.loads(text))



def specs_to_json(specs: list[RunSpec]) -> str:
    """Several runs on one federation (one registration, the same nodes) as one JSON text."""
    specs = list(specs)
    if not specs:
        raise ValueError("need at least one RunSpec")
    first = specs[0]
    other = [s.name for s in specs if (s.data, s.batch_order) != (first.data, first.batch_order)]
    if other:
        raise ValueError(f"runs sharing a federation need the same data and batch_order as {first.name!r}; "
                         f"{other} differ")
    return "[" + ",".join(s.to_json() for s in specs) + "]"


def specs_from_json(text: str) -> list[RunSpec]:
    return [RunSpec(**d) for d in json.loads(text)]


#: the run config of pflkit's Flower App (pyproject.toml ``[tool.flwr.app.config]``, ``flwr run --run-config``):
#: each key and what it holds. ``specs`` (RunSpec JSON, several runs on one federation) replaces the others when
#: set.
RUN_CONFIG = {
    "method": "a key of pflkit.flower.spec.METHODS (FedAvg, PERM, PFedMe, ...) or an import path "
              "'package.module:Class'",
    "settings": "the method class's keywords as a JSON object, e.g. '{\"local_steps\": 20, \"lr\": 0.1, ...}'",
    "model": f"one of {MODELS}",
    "model-kwargs": "the model builder's keywords as a JSON object",
    "data": "a key of pflkit.flower.spec.DATASETS",
    "data-kwargs": "the data builder's keywords as a JSON object (its seed and number of clients included)",
    "seed": "the run's seed, an integer >= 0",
    "num-server-rounds": "communication rounds, an integer >= 1",
    "eval-every": "evaluate every this many rounds, an integer >= 1",
    "batch-order": f"one of {BATCH_ORDERS}",
    "timeout": "seconds a pass waits for its replies, > 0",
    "min-clients": "0 (every client must answer) or the fewest that may (methods that tolerate a missing client)",
    "results": "a JSON file the ServerApp writes its results to ('' for none)",
    "specs": "'' or several runs as RunSpec JSON (pflkit.flower.spec.specs_to_json): replaces the keys above",
}


def specs_from_run_config(config) -> list[RunSpec]:
    """The runs a Flower run config asks for (``RUN_CONFIG``): its ``specs`` when set, else the one run its keys
    describe. A missing key, a value of the wrong type or a JSON text that does not parse raises a ValueError
    naming the key and what it holds."""
    text = str(config.get("specs", "") or "")
    if text:
        return specs_from_json(text)
    missing = [k for k in RUN_CONFIG if k not in ("specs", "results") and k not in config]
    if missing:
        raise ValueError(f"the run config lacks {missing}: pflkit's App needs " + "; ".join(
            f"{k}: {RUN_CONFIG[k]}" for k in missing))

    def mapping(key: str) -> dict:
        try:
            value = json.loads(str(config[key]))
        except json.JSONDecodeError as exc:
            raise ValueError(f"run config {key} must be {RUN_CONFIG[key]}, got {config[key]!r} ({exc})") from None
        if not isinstance(value, dict):
            raise ValueError(f"run config {key} must be {RUN_CONFIG[key]}, got {config[key]!r}")
        return value

    def number(key: str, kind: type):
        value = config[key]
        if not is_real(value) or (kind is int and value != int(value)):
            raise ValueError(f"run config {key} must be {RUN_CONFIG[key]}, got {value!r}")
        return kind(value)

    min_clients = number("min-clients", int)
    return [RunSpec(method=str(config["method"]), settings=mapping("settings"),
                    model={"name": str(config["model"]), "kwargs": mapping("model-kwargs")},
                    data={"name": str(config["data"]), "kwargs": mapping("data-kwargs")},
                    seed=number("seed", int), rounds=number("num-server-rounds", int),
                    eval_every=number("eval-every", int), batch_order=str(config["batch-order"]),
                    timeout=number("timeout", float), min_clients=min_clients or None)]
