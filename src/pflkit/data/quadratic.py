"""Quadratic problems: noisy quadratic users (Chayti et al.) and quadratic clients (Charles & Konecny).

The two families live in their own modules; this module gathers them under one name.
"""
from .quadratic_clients import *  # noqa: F401,F403
from .quadratic_users import *  # noqa: F401,F403
