"""The very uneven federation that test_uneven.py and test_full_batch.py check the full-batch passes on."""
import torch

from pflkit.data import FederatedDataset

TRAIN = (3, 40, 7, 300, 17)  # train rows per client: 3 to 300
TEST = (5, 2, 60, 9, 33)


def uneven(shape=(6,), classes=3, seed=0) -> FederatedDataset:
    """Five clients with TRAIN / TEST rows of standard-normal inputs and uniform labels."""
    g = torch.Generator().manual_seed(seed)

    def client(n):
        return torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g)

    return FederatedDataset.from_client_arrays([client(n) for n in TRAIN], [client(n) for n in TEST], classes,
                                               "uneven")
