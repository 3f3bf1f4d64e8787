"""Quadratic clients f_i = 1/2 |A_i^1/2 (x - c_i)|^2 (Charles & Konecny): filled in by the LocalUpdate work."""
__all__: list[str] = []
