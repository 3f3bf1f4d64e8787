"""Notebook plumbing: jupytext twins, smoke execution for nbval references, and stage execution.

Every notebook ``notebooks/<paper>/<name>.ipynb`` has a py:percent twin ``<name>.py`` holding the
same code. DVC stages depend on the twin, so re-running a notebook interactively (new outputs, same
code) never invalidates its stage; ``check_twins`` (run by the tests) keeps the pair in step. A stage
executes the notebook built from the twin at run time, so what runs is exactly what DVC tracks.
Kernels run over IPC (Unix sockets), not TCP.
"""
from __future__ import annotations

import csv
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator

import yaml

from . import stages
from .config import ConfigError, DEFAULT_PROFILE, PARAMS_ENV, load_params, resolve_threads, validate_stage
from .device import cpu_model, device_name, resolve_device
from .paths import link_problem, project_root, shown
from .paths import why_unwritable as _why_unwritable
from .stage_env import PROGRESS, REQUIRE_PREPARED as REQUIRE_PREPARED_ENV, TWIN_SHA256 as TWIN_SHA256_ENV

KERNEL = "pflkit"


def kernel_name() -> str:
    """The project kernel when registered (make setup), else the current env's ``python3``."""
    from jupyter_client.kernelspec import KernelSpecManager
    return KERNEL if KERNEL in KernelSpecManager().find_kernel_specs() else "python3"


def _code_cells(nb) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def _code_tags(nb) -> list[list[str]]:
    """Each code cell's tags, sorted: what papermill (``parameters``) and nbval (``nbval-skip``, ``raises-exception``,
    ...) act on."""
    return [sorted(c.metadata.get("tags", [])) for c in nb.cells if c.cell_type == "code"]


#: the tag of the cell papermill injects a stage's parameters after (its values replaced by the injected ones)
PARAMETERS_TAG = "parameters"
#: the names the stage runner injects (``run_stage``): the parameters cell must assign each, or papermill's cell,
#: injected at the top, is overwritten by the notebook's own values (a twin without the cell runs the smoke profile)
RUNNER_PARAMETERS = ("stage", "profile", "results_dir", "figures_dir")


def parameters_problem(nb, required: tuple[str, ...] = RUNNER_PARAMETERS) -> str | None:
    """What is wrong with a notebook's parameters cell, or None: exactly one code cell is tagged ``parameters``, and
    it assigns every name of ``required`` (the project's notebooks: each the runner injects; ``notebooks check``)."""
    import ast

    cells = [c for c in nb.cells if c.cell_type == "code" and PARAMETERS_TAG in c.metadata.get("tags", [])]
    if len(cells) != 1:
        return (f"{len(cells)} code cells are tagged {PARAMETERS_TAG!r}; exactly one must be (papermill injects the "
                f"stage's values after it: in py:percent, `# %% tags=[\"{PARAMETERS_TAG}\"]`)")
    try:
        tree = ast.parse(cells[0].source)
    except SyntaxError as exc:
        return f"the {PARAMETERS_TAG!r} cell does not parse: {exc.msg} (line {exc.lineno})"
    assigned = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    missing = [n for n in required if n not in assigned]
    if missing:
        return (f"the {PARAMETERS_TAG!r} cell does not assign {', '.join(missing)}; it must assign each of "
                f"{', '.join(required)} (the values the stage runner injects)")
    return None


def twin_of(notebook: Path) -> Path:
    return notebook.with_suffix(".py")


KERNELSPEC = {"name": KERNEL, "display_name": "Python (pflkit)", "language": "python"}
#: the pairing, and no notebook metadata in the twin (as jupytext.toml says), so saving in JupyterLab
#: leaves the twin byte-identical
JUPYTEXT_METADATA = {"formats": "ipynb,py:percent", "notebook_metadata_filter": "-all"}


def notebook_from_twin(py_path: str | Path, text: str | None = None):
    """The notebook built from a py:percent twin (its code and cell tags, the project kernelspec):
    what ``refresh`` stores and what a stage executes. ``text``: the twin's content, when already
    read (so what runs is exactly what was hashed)."""
    import jupytext

    py_path = Path(py_path)
    if py_path.suffix != ".py":
        raise ValueError(f"expected the py:percent twin (.py), got {py_path}")
    nb = jupytext.read(py_path) if text is None else jupytext.reads(text, fmt="py")
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["jupytext"] = dict(JUPYTEXT_METADATA)
    return nb


def _socket_folder() -> str:
    # Unix socket paths are limited to ~100 bytes: prefer the short /tmp over a long $TMPDIR
    return "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK) else tempfile.gettempdir()


@contextmanager
def ipc_kernel() -> Iterator[type]:
    """A kernel manager class for nbclient/papermill whose kernel talks over IPC (Unix sockets in a
    private 0700 temp folder, removed afterwards) instead of TCP on localhost: no open ports, and no
    "Kernel is running over TCP without encryption" warning on the terminal or in the notebook."""
    from jupyter_client import AsyncKernelManager
    from traitlets import default

    folder = tempfile.mkdtemp(prefix="pflkit-kernel-", dir=_socket_folder())
    ip = os.path.join(folder, "kernel")

    class IPCKernelManager(AsyncKernelManager):
        @default("transport")
        def _pflkit_transport(self):
            return "ipc"

        @default("ip")
        def _pflkit_ip(self):
            return ip

    try:
        yield IPCKernelManager
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def drop_blank_stderr(nb):
    """Remove stderr stream outputs whose text is empty or whitespace only (tqdm clearing a bar
    leaves such outputs); returns ``nb``."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs
                            if not (o.get("output_type") == "stream" and o.get("name") == "stderr"
                                    and not "".join(o.get("text", "")).strip())]
    return nb


def execute_notebook(input_path: str | Path, output_path: str | Path | None, cwd: str | Path,
                     parameters: dict | None = None):
    """Execute a notebook file with papermill (the project kernel over IPC, no progress bar) and
    return the executed notebook, blank stderr outputs dropped. Papermill saves progress to
    ``output_path`` while it runs (and the failed notebook there when a cell raises)."""
    import papermill

    with ipc_kernel() as manager:
        nb = papermill.execute_notebook(str(input_path), None if output_path is None else _SAVES.url(output_path),
                                        parameters=parameters, kernel_name=kernel_name(), cwd=str(cwd),
                                        progress_bar=False, kernel_manager_class=manager)
    return drop_blank_stderr(nb)


class _WholeSaves:
    """papermill I/O handler for ``pflkit-run:<path>`` (the notebook a run saves as it goes): each save is
    written whole (a ``.part`` file beside it, flushed to disk, then renamed) and its text is kept in memory
    (``last``). A save that fails (a full disk) leaves the previous whole save on disk, never a truncated
    file, and the stage's failure path still has the latest text."""

    SCHEME = "pflkit-run:"

    def __init__(self):
        self.last: dict[str, str] = {}
        self._registered = False

    def url(self, path: str | Path) -> str:
        if not self._registered:
            from papermill.iorw import papermill_io
            papermill_io.register(self.SCHEME, self)
            self._registered = True
        return self.SCHEME + str(Path(path).resolve())

    def _path(self, url: str) -> Path:
        return Path(url[len(self.SCHEME):])

    def read(self, url):
        return self._path(url).read_text(encoding="utf-8")

    def write(self, buf, url):
        path = self._path(url)
        self.last[str(path)] = buf
        _write_whole(path, buf)

    def listdir(self, url):
        return [self.SCHEME + str(p) for p in self._path(url).iterdir()]

    def pretty_path(self, url):
        return str(self._path(url))


_SAVES = _WholeSaves()


def _write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into ``<path>.<pid>.part`` beside it (flushed to disk,
    the usual mode), then renamed; a failed write removes the part file and leaves ``path`` as it was."""
    from .io import default_file_mode

    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        with open(part, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(part, default_file_mode())
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _is_whole_notebook(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")).get("cells"), list)
    except (OSError, ValueError, AttributeError):
        return False


def refresh(py_path: str | Path, execute: bool = True, timeout: int = 900) -> Path:
    """Build ``<name>.ipynb`` from its py:percent twin and run it with its smoke defaults in place,
    from the notebook's own folder (as nbval does). Stderr (progress bars) is not kept."""
    import nbformat
    from nbclient import NotebookClient

    py_path = Path(py_path)
    if py_path.suffix != ".py":
        raise ValueError(f"refresh takes the py:percent twin (.py), got {py_path}")
    nb = notebook_from_twin(py_path)
    if execute:
        with ipc_kernel() as manager:
            client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name(), record_timing=False,
                                    kernel_manager_class=manager,
                                    resources={"metadata": {"path": str(py_path.parent.resolve())}})
            client.execute()
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = [o for o in cell.outputs if o.get("name") != "stderr"]
    out = py_path.with_suffix(".ipynb")
    nbformat.write(nb, out)
    return out


def check_twins(root: str | Path | None = None) -> list[str]:
    """Problems with notebook/twin pairs under notebooks/ (empty list = all in step)."""
    import jupytext
    import nbformat

    root = Path(root or project_root())
    problems = []
    notebooks = sorted((root / "notebooks").rglob("*.ipynb"))
    for nb_path in notebooks:
        if ".ipynb_checkpoints" in nb_path.parts:
            continue
        twin = twin_of(nb_path)
        if not twin.exists():
            problems.append(f"{nb_path}: no py:percent twin {twin.name}")
            continue
        nb, paired = nbformat.read(nb_path, as_version=4), jupytext.read(twin)
        fix = f"run `python -m pflkit notebooks refresh {twin.relative_to(root)}` or sync with jupytext"
        if _code_cells(nb) != _code_cells(paired):
            problems.append(f"{nb_path}: code differs from {twin.name}; {fix}")
        elif _code_tags(nb) != _code_tags(paired):
            i, a, b = next((i, a, b) for i, (a, b) in enumerate(zip(_code_tags(nb), _code_tags(paired))) if a != b)
            problems.append(f"{nb_path}: cell tags differ from {twin.name} (code cell {i}: the notebook has {a}, "
                            f"the twin {b}); {fix}")
        for path, notebook in ((twin, paired), (nb_path, nb)):
            why = parameters_problem(notebook)
            if why:
                problems.append(f"{path}: {why}")
    for twin in sorted((root / "notebooks").rglob("*.py")):
        if not twin.with_suffix(".ipynb").exists():
            problems.append(f"{twin}: no notebook {twin.with_suffix('.ipynb').name}")
    return problems


def stage_outputs(stage: str, root: Path, profile: str = DEFAULT_PROFILE) -> list[Path]:
    """Every path the stage declares in dvc.yaml (outs, metrics, plots); for another profile, where that
    profile's run writes each (``profile_path``)."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"].get(stage)
    if spec is None:
        raise ConfigError(f"dvc.yaml has no stage {stage!r}")
    paths = []
    for key in ("outs", "metrics", "plots"):
        for entry in spec.get(key, []) or []:
            paths.append(root / stages.profile_path(entry if isinstance(entry, str) else next(iter(entry)), profile))
    return paths


def stage_notebook(stage: str, root: Path) -> PurePosixPath | None:
    """The notebook dvc.yaml's command runs for ``stage`` (``python -m pflkit stage <stage> <notebook>``;
    dvc.yaml is written from the stage table, ``pflkit.stages``), or None when its command names none."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"].get(stage)
    if spec is None:
        raise ConfigError(f"dvc.yaml has no stage {stage!r}")
    cmd = spec.get("cmd")
    words = shlex.split(cmd) if isinstance(cmd, str) else []
    for i in range(len(words) - 2):
        if words[i] == "stage" and words[i + 1] == stage:
            return PurePosixPath(words[i + 2])
    return None


def _check_pair(stage: str, notebook: Path, root: Path) -> Path:
    """``notebook`` (relative to the project) when it is the one dvc.yaml runs for ``stage`` (its ``.ipynb``
    or its py:percent twin), else :class:`StageError` naming the stage, the given and the expected notebook:
    a wrong pair would remove another stage's executed report."""
    given = notebook
    if notebook.is_absolute():
        for candidate in (notebook, notebook.resolve()):
            try:
                notebook = candidate.relative_to(root)
                break
            except ValueError:
                continue
    expected = stage_notebook(stage, root)
    if expected is None:
        raise StageError(f"stage {stage}: dvc.yaml's command names no notebook, so {given} cannot be checked "
                         "against it (nothing was run or removed)")
    if PurePosixPath(notebook.as_posix()) not in (expected, expected.with_suffix(".py")):
        raise StageError(f"stage {stage}: notebook {given} is not this stage's; dvc.yaml (from pflkit.stages) "
                         f"runs {expected} for it (nothing was run or removed)")
    return Path(expected)


def _is_compute_stage(stage: str) -> bool:
    row = stages.get(stage)
    return row is not None and not row.is_plot



class StageError(RuntimeError):
    """A stage cannot start, or cannot write its outputs: the message names the path and why."""


def run_stage(stage: str, notebook: str | Path, params_file: str = "params.yaml",
              profile: str = DEFAULT_PROFILE) -> Path:
    """Validate the stage's parameters, execute its notebook at params.yaml's scale, and leave the executed
    copy in reports/. With another ``profile`` (e.g. ``paper``) the values are that profile's and every
    output goes under build/<profile>/ (``profile_path``), the executed copy to build/<profile>/reports/.

    The notebook executed is built at run time from the py:percent twin ``<name>.py`` (the file DVC
    tracks), never from the stored ``.ipynb``: an edit in the twin is what runs, an edit made only in
    the ``.ipynb`` is not (``pflkit notebooks check`` reports such a pair). The executed copy is built
    in a per-run file ``build/running/<stage>.<pid>.*.ipynb`` (concurrent runs never share one).

    Before anything is removed or run (else :class:`StageError` naming the path and why): ``notebook`` must
    be the one dvc.yaml's command names for ``stage`` (``_check_pair``; dvc.yaml is written from
    ``pflkit.stages``), its twin must have its parameters cell (``parameters_problem``); no declared output,
    working folder (build/running, build/failed, checkpoints) or folder above one inside the project may be a
    symbolic link; each must be writable, and an existing output
    folder must be one whose old contents can be removed. On any failure -- a cell raising, Ctrl-C, or an
    OSError such as a full disk while writing the report -- every declared output is removed (no
    half-written results) and the failed notebook is kept whole as ``build/failed/<stage>.ipynb`` (every
    save of the running notebook is written whole and kept in memory; a copy that cannot be written whole
    is not kept: never a truncated one); a success removes a stale one.
    Files are written with the usual mode (0o666 & ~umask). A compute stage's headline numbers, its DVC
    metrics, are written from the metrics.json the notebook wrote (``pflkit.headline.write_headline``).

    Progress goes to stderr: a start line, each line the kernel writes with
    :func:`pflkit.progress.note` as ``[<stage> <elapsed>s] <line>``, and an end line with the time.

    The notebook's kernel gets its environment from :func:`_kernel_environment` (set for the run, restored
    afterwards).
    """
    import nbformat

    from .io import atomic_path

    root = project_root()
    cfg = validate_stage(load_params(root / params_file), stage, profile)  # bad input fails before any work
    twin, report, outputs, running, failed = _stage_paths(stage, Path(notebook), root, profile, cfg)
    code = twin.read_bytes()
    nb = _runnable_notebook(stage, twin, code, root)  # its parameters cell, checked before anything is removed
    tmp, progress = _prepare_run(stage, outputs, running, [root / cfg.results_dir, report.parent], nb, root)
    temps = [tmp, progress]

    start = time.monotonic()
    print(f"{stage}: running {twin.relative_to(root)} ...", file=sys.stderr, flush=True)
    echo = _ProgressEcho(progress, stage, start)
    try:
        with _environ(_kernel_environment(progress, code, root / params_file, profile)):
            echo.start()
            try:
                # the notebook reads its values from params.yaml (the profile's); the runner names the
                # stage, the profile and the output folders
                executed = execute_notebook(tmp, tmp, cwd=root, parameters=dict(zip(RUNNER_PARAMETERS, (
                    stage, profile, cfg.results_dir, cfg.figures_dir))))
            finally:
                echo.stop()
        if _is_compute_stage(stage):  # its DVC metrics, from the metrics.json it wrote (pflkit.headline)
            from .headline import write_headline
            write_headline(stage, root / cfg.results_dir)
        executed.metadata.setdefault("papermill", {}).update(
            input_path=str(twin.relative_to(root)), output_path=str(report.relative_to(root)))
        with atomic_path(report) as part:  # inside the clean-up: a failed write leaves no report
            nbformat.write(executed, part)
    except BaseException as exc:
        where = _discard_failed_run(stage, outputs, tmp, failed, root, start)
        if isinstance(exc, OSError):
            raise StageError(f"stage {stage} failed: {_describe(exc, root)}; none of its outputs were kept "
                             f"({where})") from exc
        raise
    finally:
        _SAVES.last.pop(str(tmp.resolve()), None)
        for path in temps:
            path.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)  # a failure of an earlier run is stale now
    seconds = time.monotonic() - start
    print(f"{stage}: done in {seconds:.1f} s", file=sys.stderr, flush=True)
    record_runtime(root, stage, profile, seconds, cfg)
    return report


def _kernel_environment(progress: Path, code: bytes, params_file: Path, profile: str) -> dict[str, str]:
    """The environment variables :func:`run_stage` sets for the notebook's kernel:

    - ``PFLKIT_PROGRESS`` (:data:`pflkit.stage_env.PROGRESS`): a fresh per-run file in build/running/ that
      the kernel appends progress lines to; this process echoes them and deletes it afterwards.
    - ``PFLKIT_TWIN_SHA256``: the sha256 hex digest of the twin's bytes, i.e. of the code this run
      executes (for checkpoint fingerprints: checkpoints written by other code are not resumed).
    - ``PFLKIT_PARAMS`` (:data:`pflkit.config.PARAMS_ENV`): the params file validated here, which the
      notebook's ``from_namespace`` reads (the injected parameters name stage, profile ``default`` and
      the output folders; every other value comes from that file).
    - ``PFLKIT_REQUIRE_PREPARED`` (:data:`pflkit.stage_env.REQUIRE_PREPARED`): 1 for the default profile and
      the profiles with a pipeline of their own (``pflkit.stages.PIPELINE_PROFILES``), whose stages must read
      their data from data/prepared/ (the data stages' outputs DVC tracks).
    """
    return {PROGRESS: str(progress), TWIN_SHA256_ENV: hashlib.sha256(code).hexdigest(),
            PARAMS_ENV: str(params_file),
            # the pipeline's stages read data only from the data stages' outputs (DVC deps)
            REQUIRE_PREPARED_ENV: "1" if profile == DEFAULT_PROFILE or profile in stages.PIPELINE_PROFILES else "0"}


def _runnable_notebook(stage: str, twin: Path, code: bytes, root: Path):
    """The notebook built from the twin's ``code`` (``notebook_from_twin``), or a :class:`StageError` naming the twin
    when it cannot run as a stage: a twin that does not parse, or one without exactly one parameters cell
    (``parameters_problem``: without it papermill injects the values at the top and the notebook's own cell replaces
    them, running another profile; which names the cell assigns, ``notebooks check`` checks)."""
    try:
        nb = notebook_from_twin(twin, code.decode("utf-8"))
    except Exception as exc:  # jupytext's errors (and UnicodeDecodeError) name no common base
        raise StageError(f"stage {stage}: {twin.relative_to(root)} cannot be read as a py:percent notebook: {exc} "
                         "(nothing was run or removed)") from None
    why = parameters_problem(nb, required=())
    if why:
        raise StageError(f"stage {stage}: {twin.relative_to(root)}: {why} (nothing was run or removed)")
    return nb


def _prepare_run(stage: str, outputs: list[Path], running: Path, folders: list[Path], nb,
                 root: Path) -> tuple[Path, Path]:
    """Remove the stage's old outputs, create ``running`` (build/running) and ``folders``, and write the notebook
    ``nb`` (``_runnable_notebook``) to a per-run file in ``running``; returns (that notebook, the per-run progress
    file). An OSError becomes a :class:`StageError` and leaves no per-run file behind."""
    import nbformat
    temps: list[Path] = []
    try:
        for path in outputs:
            _remove(path)
        for folder in (running, *folders):  # figures: only where a plot saves one
            folder.mkdir(parents=True, exist_ok=True)
        _remove_stale_running(running, stage)
        tmp = _run_file(running, stage, ".ipynb")
        temps.append(tmp)
        progress = _run_file(running, stage, ".progress")
        temps.append(progress)
        nbformat.write(nb, tmp)
    except OSError as exc:
        for path in temps:
            path.unlink(missing_ok=True)
        raise StageError(f"stage {stage} cannot prepare its outputs: {_describe(exc, root)}") from None
    return tmp, progress


def _stage_paths(stage: str, notebook: Path, root: Path, profile: str, cfg) -> tuple:
    """(twin, report, outputs, running folder, failed copy) of a stage run, once checked: ``notebook`` is the one
    dvc.yaml names for ``stage``, its py:percent twin exists, and no output or working folder is a link or
    unwritable (:class:`StageError` otherwise, before anything is removed)."""
    notebook = _check_pair(stage, notebook, root)
    twin = root / twin_of(notebook)
    if not twin.is_file():
        raise StageError(f"stage {stage}: no py:percent twin {twin_of(notebook)}; the stage executes the twin "
                         f"(the file DVC tracks): create it with `jupytext --set-formats ipynb,py:percent {notebook}`")
    report_rel = PurePosixPath("reports") / notebook.with_suffix(".ipynb").relative_to("notebooks")
    report = root / stages.profile_path(str(report_rel), profile)
    outputs = stage_outputs(stage, root, profile)
    if report not in outputs:
        outputs.append(report)
    running = root / "build" / "running"
    failed = root / "build" / "failed" / f"{stage}.ipynb"
    checkpoints = root / ("build" if profile == DEFAULT_PROFILE else f"build/{profile}") / "checkpoints"
    _check_writable(stage, root, [p.parent for p in outputs]
                    + [running, failed.parent, root / cfg.results_dir, root / cfg.figures_dir, checkpoints],
                    written=[*outputs, running, failed, root / cfg.results_dir, root / cfg.figures_dir, checkpoints])
    return twin, report, outputs, running, failed


def _discard_failed_run(stage: str, outputs: list[Path], tmp: Path, failed: Path, root: Path, start: float) -> str:
    """After a failed run: remove every declared output, keep the failed notebook whole (``_keep_failed``), say
    so on stderr; returns where the failed notebook is (or why it is not kept)."""
    left = []
    for path in outputs:
        try:
            _remove(path)
        except OSError:
            left.append(str(path.relative_to(root)))
    where = _keep_failed(tmp, failed, _SAVES.last.pop(str(tmp.resolve()), None), root)
    print(f"stage {stage} failed after {time.monotonic() - start:.1f} s; {where}", file=sys.stderr, flush=True)
    if left:
        print(f"stage {stage}: could not remove {', '.join(left)}; delete them by hand", file=sys.stderr)
    return where


#: every successful stage run appends a line here (build/: never a DVC output); scripts/stage_runtimes.py
#: turns it into README's table of runtimes per stage and profile
RUNTIMES_LOG = "build/runtimes.csv"
RUNTIME_COLUMNS = ("stage", "profile", "seconds", "device", "threads", "cpu", "finished_utc")


def record_runtime(root: Path, stage: str, profile: str, seconds: float, cfg) -> None:
    """Append one stage run's wall time (and where it ran) to ``RUNTIMES_LOG``; never fails the stage."""
    try:
        # a plot stage (``computes`` False) draws on the CPU; resolving its device would import torch here
        name = device_name(resolve_device(cfg.device)) if cfg.computes else "cpu"
        cpu = cpu_model() or platform.processor() or platform.machine()
        path = root / RUNTIMES_LOG
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists()
        with path.open("a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(RUNTIME_COLUMNS)
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            w.writerow([stage, profile, f"{seconds:.1f}", name, resolve_threads(cfg.threads),
                        f"{cpu} x{os.cpu_count()}", now])
    except (OSError, ValueError) as exc:
        print(f"{stage}: runtime not recorded in {RUNTIMES_LOG} ({exc})", file=sys.stderr)


def _describe(exc: OSError, root: Path) -> str:
    """``<path>: <reason>`` for an OSError, the path relative to the project when inside it."""
    if exc.filename is None:
        return str(exc)
    return f"{shown(exc.filename, root)}: {exc.strerror or exc}"


def _check_writable(stage: str, root: Path, folders: list[Path], written: list[Path] = ()) -> None:
    """Refuse (StageError naming each path and why) before any work when a file cannot be created in one of
    ``folders``; when a path the stage writes (``written``: its declared outputs and working folders) or a
    folder above it inside the project is a symbolic link or lies outside the project; or when an existing
    output folder holds a folder it cannot empty (removing the old outputs would stop half-way)."""
    problems = []
    for path in written:
        why = link_problem(path, root)
        if why:
            problems.append(f"  {why}")
    for folder in dict.fromkeys(folders):  # unique, in order
        why = _why_unwritable(folder)
        if why:
            problems.append(f"  {shown(folder, root)}: {why.replace(str(root) + os.sep, '')}")
    for path in written:
        if path.is_dir() and not path.is_symlink():
            for inner, _, _ in os.walk(path):
                why = _why_unwritable(Path(inner))
                if why:
                    problems.append(f"  {shown(Path(inner), root)}: its old contents cannot be removed: "
                                    f"{why.replace(str(root) + os.sep, '')}")
                    break
    problems = list(dict.fromkeys(problems))
    if problems:
        raise StageError(f"stage {stage} cannot write its outputs (nothing was run or removed):\n"
                         + "\n".join(problems))


def _run_file(running: Path, stage: str, suffix: str) -> Path:
    """A fresh file ``<stage>.<pid>.<random><suffix>`` in build/running/, with the usual mode."""
    from .io import default_file_mode

    fd, name = tempfile.mkstemp(prefix=f"{stage}.{os.getpid()}.", suffix=suffix, dir=running)
    os.close(fd)
    os.chmod(name, default_file_mode())
    return Path(name)


def _remove_stale_running(running: Path, stage: str) -> None:
    """Remove this stage's per-run files left by runs that were killed (their process is gone)."""
    for path in running.glob(f"{stage}.*"):
        pid = path.name[len(stage) + 1:].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _keep_failed(tmp: Path, failed: Path, text: str | None, root: Path) -> str:
    """Keep the failed run's notebook, whole, as build/failed/<stage>.ipynb and say where it is: the latest
    save (``text``, from memory) written whole; else, when that cannot be written (a full disk), the last
    save that reached the disk whole, renamed into place (needs no space). A copy that cannot be kept whole
    is not kept at all (never a truncated .ipynb), and a stale one from an earlier run is removed."""
    name = shown(failed, root)
    why = None
    try:
        failed.unlink(missing_ok=True)
        failed.parent.mkdir(parents=True, exist_ok=True)
        if text is not None:
            try:
                _write_whole(failed, text)
                return f"the executed notebook is in {name}"
            except OSError as exc:
                why = _describe(exc, root)
        if _is_whole_notebook(tmp):
            os.replace(tmp, failed)
            return (f"the executed notebook is in {name}" if why is None else
                    f"the notebook as last saved during the run is in {name} (its final state could not be "
                    f"written: {why})")
    except OSError as exc:
        why = _describe(exc, root)
    for path in (failed, tmp):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
    return (f"the executed notebook could not be kept whole ({why or 'no whole copy was saved'}); "
            "no partial copy is left")


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables (inherited by the kernel) for a block; restore them afterwards."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _ProgressEcho(threading.Thread):
    """Tail the kernel's progress file and echo each complete new line to stderr as
    ``[<stage> <elapsed>s] <line>`` (flushed); :meth:`stop` echoes what is left."""

    def __init__(self, path: Path, stage: str, start: float, interval: float = 0.2):
        super().__init__(name=f"pflkit-progress-{stage}", daemon=True)
        self.path, self.stage, self.start_time, self.interval = Path(path), stage, start, interval
        self._done = threading.Event()
        self._offset = 0
        self._partial = b""

    def run(self):
        while not self._done.wait(self.interval):
            self._pump()

    def stop(self):
        self._done.set()
        if self.is_alive():
            self.join()
        self._pump(final=True)

    def _pump(self, final: bool = False):
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            data = b""
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                print(f"[{self.stage} {time.monotonic() - self.start_time:.1f}s] {text}", file=sys.stderr,
                      flush=True)


def _remove(path: Path):
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)

