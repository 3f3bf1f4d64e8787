"""Experiment definitions behind the notebooks: one module per paper, each with a validated config
per stage and a function per figure. The stages themselves (which config, notebook and outputs each
has) are listed in ``pflkit.stages``; importing this package imports none of its modules."""
