"""Experiment definitions behind the notebooks: one module per paper, each with a validated config
per stage and a function per figure. Importing this package registers every stage config."""
import importlib

for _name in ("perm", "perm_hetero", "chayti", "charles", "charles_nn"):
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as exc:  # a paper module not written yet
        if exc.name != f"{__name__}.{_name}":
            raise
