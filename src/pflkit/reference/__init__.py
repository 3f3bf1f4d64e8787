"""Slow, obviously-correct per-client loops: the twins the tests hold the batched engine to.

Nothing here is vectorized: each model is an ``nn.Module``, each step a Python loop iteration with
``torch.autograd``. Random draws come from the same ``FederatedDataset.sample_indices`` calls, made
in the same order, as the batched code, so both see identical minibatches.
"""
