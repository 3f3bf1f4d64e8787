"""Slow, obviously-correct per-client loops: the twins the tests hold the batched engine to.

They live with the tests, not in the package (pytest puts ``tests/`` on ``sys.path``: pyproject.toml
``pythonpath``; the benchmarks that time the batched engine against them insert it themselves), so
``import reference`` is how tests and benchmarks reach them.

Nothing here is vectorized: each model is an ``nn.Module``, each step a Python loop iteration with
``torch.autograd``. Random draws come from the same ``FederatedDataset.sample_indices`` calls, made
in the same order, as the batched code, so both see identical minibatches.
"""
