"""pflkit's methods on a real federated engine: Flower (``pip install -e '.[flower]'``).

One process is one client and only models (and a key per pass, below) travel. The
in-process algorithm classes stay the single source of every method's math:

* **One round, the algorithm's own.** Every method's round is a generator of passes
  (``algorithms.round``: ``round_passes``, ``start_passes``, ``personalize_pass``), the same one the
  in-process ``round`` runs. The server (``server.FederatedServer``, one for every method) keeps the
  algorithm's state (PERM: the N personalized models, alpha, the shuffle permutation) and drives those
  passes: each client gets the models it hosts, their per-model values and minibatch rows, and the
  stacked replies go back to the algorithm, which aggregates and steps with its own functions.
* **Client side** (``client.FederatedClient``): a node holds one partition of the federation and runs the
  client step a pass names (one of the method's declared ``client_steps``) for that one client, with a
  one-client dataset, then ``eval.evaluate`` for an evaluation pass.
* **Failures.** A client that does not answer a pass stops the run with an error naming it, the round
  and the pass, unless ``RunSpec.min_clients`` lets a method that ``tolerates_missing`` go on without it;
  the server records who answered every pass (``participation``) and the loopback replays it.
* **Same draws, same result.** Randomness is per client (``data.draws``): in every pass each client draws
  its minibatch rows and dropout masks from its own stream, seeded from the pass's key (drawn by the server
  from the run's generator) and its id. The server sends the key; the client draws alone exactly what it
  draws inside the batch. So with the same seed a federated run reproduces the in-process one (float32
  rounding of one client alone vs inside the batch aside).
* **Transports.** A round is a Python generator of passes (``{client: Job}`` out, ``{client: Reply}``
  in), so the same server code runs over ``loopback`` (in one process, no Flower: tests),
  Flower's simulation engine (``simulation``, Ray) and its deployment engine (``deployment``: a
  SuperLink and N stock SuperNodes as local processes). ``apps`` holds the Flower ClientApp, ServerApp and
  the Strategy whose ``configure_train`` addresses each node with its own message.

Only ``apps`` and ``simulation`` import flwr, its public API only (``flwr.app``, ``flwr.clientapp``,
``flwr.serverapp``, ``flwr.simulation``; pyproject.toml's import contracts forbid Flower's SuperCore, SuperNode,
SuperLink and constants); ``deployment`` runs Flower's own commands, and ``apps``' ServerApp and ClientApp are
the Flower App of pyproject.toml's ``[tool.flwr.app]``. Runs stay offline: Flower's and Ray's
telemetry, update checks and runtime dependency installation are off (``OFFLINE_ENV``) where an engine
starts: ``simulation.simulate`` sets them in its process (Flower reads them when flwr is first imported,
Ray at ``ray.init``, and Ray's workers inherit them), and ``deployment.Deployment`` passes them to every
process it starts. Importing this package changes nothing.
"""
from __future__ import annotations

import importlib.util

#: the engines a run is compared on, by key, and their names in tables and figures (in the order rows are
#: written: Flower's last, so a run without Flower writes the first rows of a run with it)
ENGINE_NAMES = {"in-process": "in-process (batched)", "loopback": "federated protocol, one process",
                "simulation": "Flower simulation (Ray)", "deployment": "Flower deployment (SuperLink + SuperNodes)"}

#: Flower and Ray never phone home, never look for updates and never install packages at run time
OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}

INSTALL_HINT = "pip install -e '.[flower]' (Flower 1.42 with its Ray simulation engine)"


def flower_installed() -> bool:
    """Whether flwr (the optional extra ``pflkit[flower]``) can be imported."""
    return importlib.util.find_spec("flwr") is not None


def require_flower() -> None:
    """Raise an ImportError that says how to install Flower when it is missing."""
    if not flower_installed():
        raise ImportError(f"Flower is not installed: {INSTALL_HINT}")
