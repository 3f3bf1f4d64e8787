"""Checks of arguments that name the argument and what it allows, for every layer (imports nothing of pflkit)."""
from __future__ import annotations

import math

#: longest echo of an offending value in a message; longer values are cut (a whole section is never echoed)
ECHO_LIMIT = 80


def short_repr(value, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters with a note of the full length."""
    return cut(repr(value), limit)


def cut(text: str, limit: int = ECHO_LIMIT) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}... ({len(text)} characters)"


def is_int(v) -> bool:
    """An int (a bool is not)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_real(v) -> bool:
    """An int or float (a bool is neither)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_number(v) -> bool:
    """An int or float (no bool), finite."""
    return is_real(v) and math.isfinite(v)


def check_int(name: str, value, minimum: int, allowed: str | None = None):
    """``value`` if it is an integer (a bool is not) >= ``minimum``, else a ValueError: "``name`` must be
    ``allowed`` (by default "an integer >= ``minimum``"), got ``value``"."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be {allowed or f'an integer >= {minimum}'}, got {value!r}")
    return value


def check_positive(name: str, value, integer: bool = False, allow_zero: bool = False):
    """``value`` if it is a number (with ``integer``, an integer; a bool is neither) > 0 (>= 0 with
    ``allow_zero``), else a ValueError naming ``name``."""
    if not (is_int(value) if integer else is_real(value)) or not (value >= 0 if allow_zero else value > 0):
        kind = "an integer" if integer else "a number"
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {kind} {bound}, got {value!r}")
    return value
