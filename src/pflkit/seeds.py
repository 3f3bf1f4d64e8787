"""Every derived random stream, in one place: the seed of each stream as a function of the run's seed
(and round or panel), so no offset is a literal scattered through the code. Changing a formula here
changes results (tests/regression compares them)."""
from __future__ import annotations


def evaluation(seed: int, round: int) -> int:
    """Draws made while evaluating (e.g. fine-tuning before testing), apart from the training stream
    so that evaluating never changes the training trajectory."""
    return 1_000_003 * (seed + 1) + round


def extraction_masks(seed: int, round: int) -> int:
    """The ``random`` sub-model extraction of PERM-hetero / partial training, apart from the training draws."""
    return 7_919 * (seed + 1) + 104_729 * round + 17


def data_sample(seed: int) -> int:
    """A fixed sample drawn once from the data: the pooled subsample of an image federation
    (``pool_size``), the evaluation sample of the Charles et al. grids."""
    return 10_000 + seed


def tuning(seed: int, panel: int) -> int:
    """Step-size tuning runs of panel ``panel`` (Chayti et al.), apart from the reported runs."""
    return seed + 1 + 1000 * panel


_MASK64 = (1 << 64) - 1


def mix(*values: int) -> int:
    """A 63-bit seed from integers: splitmix64's step and finaliser over each value in turn (distinct inputs give
    unrelated seeds; Python integers, so the same on every machine)."""
    h = 0
    for v in values:
        z = (h + 0x9E3779B97F4A7C15 + (int(v) & _MASK64)) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h >> 1


def client_stream(key: int, client: int) -> int:
    """Client ``client``'s draws in the pass keyed ``key`` (``data.draws.ClientDraws``: its minibatch rows and
    dropout masks), the same whether it computes alone or inside the batch."""
    return mix(key, client)
