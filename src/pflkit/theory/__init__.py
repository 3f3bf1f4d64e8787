"""Closed forms: surrogate losses, condition numbers, rates, Pareto frontiers, speedups.

Submodules: ``speedup`` (Chayti et al.), ``surrogate`` (Charles & Konecny). Import them directly.
"""
