"""Project-relative paths: notebooks run with their own folder as cwd (JupyterLab, nbval) or with the
project root (papermill --cwd); outputs always land relative to the project root."""
from __future__ import annotations

import os
import stat
from pathlib import Path


def project_root(start: str | os.PathLike | None = None) -> Path:
    """The nearest folder at or above ``start`` (default cwd) holding both dvc.yaml and params.yaml."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").exists() and (folder / "params.yaml").exists():
            return folder
    return here


def resolve(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path if path.is_absolute() else project_root() / path


def shown(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """``path`` as a message shows it: relative to the project (at ``root``; default this one) when it lies
    inside it, else as it is."""
    path, root = Path(path).absolute(), Path(root) if root is not None else project_root()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def link_problem(path: str | os.PathLike, root: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be written as an output of the project at ``root`` (a resolved folder), or None:
    it lies outside the project, or it or a folder between the project and it is a symbolic link (what is
    written there would land elsewhere, where no DVC output records it). Parts that do not exist yet are fine."""
    root = Path(root)
    path = Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        return f"{path} lies outside the project ({root})"
    if ".." in rel.parts:
        return f"{rel} leaves the project ('..')"
    probe = root
    for part in rel.parts:
        probe = probe / part
        if probe.is_symlink():
            return (f"{probe.relative_to(root)} is a symbolic link (to {os.readlink(probe)}); an output and its "
                    "folders must be real files and folders inside the project")
        if not probe.exists():
            break
    return None


def why_unwritable(folder: str | os.PathLike) -> str | None:
    """Why files cannot be created in ``folder`` (created on demand if missing), or None."""
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    missing = "" if probe == folder else "cannot create it: "
    if not probe.is_dir():
        return f"{missing}{probe} is a file, not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        try:
            readonly_fs = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        except OSError:
            readonly_fs = False
        if readonly_fs:
            return f"{missing}{probe} is on a read-only file system"
        st = probe.stat()
        return (f"{missing}{probe} is not writable by this user (permission denied: mode "
                f"{stat.filemode(st.st_mode)}, owner uid {st.st_uid}, this process uid {os.getuid()})")
    return None
