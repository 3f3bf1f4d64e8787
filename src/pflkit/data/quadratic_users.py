"""Noisy quadratic users (Chayti et al.): filled in by the linear-speedup work."""
__all__: list[str] = []
