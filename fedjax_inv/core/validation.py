"""Argument checks shared by the whole package (one style: ``name=value; what is allowed``).

Every check returns the value converted (float / int / the choice) and raises
``ValueError`` with one line naming the argument, the bad value and the fix, before
anything is compiled. It imports nothing of the package, so the engine may use it too.
"""
from __future__ import annotations

import math


def finite(name: str, value, fix: str = "use a finite number") -> float:
  """``value`` as a float; ValueError for a bool, a non-number, NaN or ±inf."""
  try:
    v = float(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}={value!r} is not a number; {fix}.") from e
  if isinstance(value, bool) or not math.isfinite(v):
    raise ValueError(f"{name}={value!r}; {fix}.")
  return v


def positive(name: str, value) -> float:
  """A finite float ``> 0`` (learning rates, scales)."""
  v = finite(name, value, "use a finite number > 0")
  if v <= 0:
    raise ValueError(f"{name}={value!r}; it must be > 0.")
  return v


def nonneg(name: str, value) -> float:
  """A finite float ``>= 0`` (penalty coefficients: 0 switches the term off)."""
  v = finite(name, value, "use a finite number >= 0")
  if v < 0:
    raise ValueError(f"{name}={value!r}; it must be >= 0 (0 switches the term off).")
  return v


def probability(name: str, value) -> float:
  """A float in ``[0, 1]``."""
  v = finite(name, value, "use a probability in [0, 1]")
  if not 0.0 <= v <= 1.0:
    raise ValueError(f"{name}={value!r}; it must be a probability in [0, 1].")
  return v


def integer(name: str, value, minimum: int = 1):
  """An integral number ``>= minimum`` as an int (``3.0`` is accepted, ``True`` not)."""
  ok = not isinstance(value, bool)
  try:
    ok = ok and int(value) == value
  except (TypeError, ValueError):
    ok = False
  if not ok or value < minimum:
    raise ValueError(f"{name}={value!r}; it must be an integer >= {minimum}.")
  return int(value)


def pos_int(name: str, value, allow_none: bool = False, none_means: str = ""):
  """A Python int ``>= 1`` (a float is refused), or None when ``allow_none``."""
  if value is None and allow_none:
    return None
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    extra = f" or None ({none_means})" if allow_none else ""
    raise ValueError(f"{name}={value!r}; use a positive int{extra}.")
  return int(value)


def choice(name: str, value, choices):
  """``value`` if it is one of ``choices``."""
  if value not in choices:
    raise ValueError(f"{name}={value!r}; choose one of {tuple(choices)}.")
  return value


def flag(name: str, value, meaning: str = "") -> bool:
  """``value`` if it is a bool (``1``, ``'yes'`` are refused: a typo must not pass)."""
  if not isinstance(value, bool):
    raise ValueError(f"{name}={value!r}; pass True or False{meaning}.")
  return value


def one_of(what: str, value, valid, label: str = "valid") -> None:
  """Raises ``ValueError('unknown {what} {value!r}; {label}: a, b')`` unless ``value`` is
  one of ``valid`` (names of datasets, sources, variants: the data modules' wording)."""
  if value not in valid:
    raise ValueError(f"unknown {what} {value!r}; {label}: {', '.join(valid)}")
