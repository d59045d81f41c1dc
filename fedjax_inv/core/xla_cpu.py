"""XLA:CPU flags that fedjax_inv sets, each chosen by measurement.

``FLAGS`` maps an XLA flag name to its value. The settings were timed on the benchmark's
rounds by ``benchmarks/cpu_flags.py``; the measurements and the choice are in
``benchmarks/RESULTS.md`` ("XLA:CPU flags"). All of them are ``xla_cpu_*`` flags, which only
the CPU backend reads: on a GPU or TPU they change nothing.

:func:`apply` runs when ``fedjax_inv`` is imported. It merges ``FLAGS`` into the
``XLA_FLAGS`` environment variable:

* only on the hosts where they were measured to help (:func:`host_wants_flags`: x86-64
  without AVX-512, a tested jaxlib);
* only where the user has not set that flag (a flag already in ``XLA_FLAGS`` wins);
* only before JAX has started its backends (XLA reads ``XLA_FLAGS`` then, not at
  ``import jax``); when they have started it adds nothing and says so in :func:`status`;
* never when ``FEDJAX_INV_CPU_FLAGS=0`` (the switch; ``false``/``no``/``off`` also work).

What was added is recorded in every run's ``summary.json`` (``jax.cpu_flags``) and in the
benchmark's meta, through :func:`status`.
"""
from __future__ import annotations

import os
import shlex
import sys

SWITCH = "FEDJAX_INV_CPU_FLAGS"
# YNNPACK's convolution kernels off (its dot, reduce and elementwise fusions stay on): XLA
# then runs a convolution that is not fused with its neighbours on Eigen. Measured on a
# 2-core AMD EPYC (Zen 3, AVX2, no AVX-512), JAX 0.10.2 (`benchmarks/cpu_flags.py`): the
# ConvNet round 1.32x faster at C=100 and 1.45x at C=10, the MLP and heavy rounds
# unchanged. On an AVX-512 Intel Xeon the YNN kernels were the faster ones (all YNN fusions
# off: ConvNet 0.87x), so the flag is set only on CPUs without AVX-512.
FLAGS: dict[str, str] = {"xla_cpu_experimental_ynn_fusion_type": "-individual_convolution"}
# jaxlib versions whose XLA:CPU knows FLAGS: an unknown XLA flag aborts the process when the
# backend starts, so a newer jaxlib gets no flag until it is measured again.
JAXLIB_TESTED = ("0.10.",)
_STATUS: dict = {"added": {}, "note": "not applied yet"}


def _names(xla_flags: str) -> set[str]:
  names = set()
  for tok in shlex.split(xla_flags):
    if tok.startswith("--"):
      names.add(tok[2:].split("=", 1)[0])
  return names


def flag_value(name: str, xla_flags: str | None = None) -> str | None:
  """The value of ``--name=...`` in ``xla_flags`` (default: the environment's
  ``XLA_FLAGS``; the last occurrence wins, as in XLA's parser), or None when absent.

  Raises:
    ValueError: unbalanced quotes in ``xla_flags``.
  """
  flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
  value = None
  for tok in shlex.split(flags):
    if tok.startswith(f"--{name}="):
      value = tok.split("=", 1)[1]
  return value


def backends_started() -> bool:
  """Whether JAX has created its backends (after which ``XLA_FLAGS`` has no effect)."""
  if "jax" not in sys.modules:
    return False
  try:
    from jax._src import xla_bridge
    return bool(xla_bridge.backends_are_initialized())
  except (ImportError, AttributeError):  # private API moved: assume the worst
    return True


def _cpu_has_avx512(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
  """Whether the host CPU has AVX-512 (None when unknown: not Linux, unreadable)."""
  try:
    with open(cpuinfo) as f:
      for line in f:
        if line.startswith("flags"):
          return "avx512f" in line.split()
  except OSError:
    return None
  return None


def _jaxlib_version() -> str | None:
  try:
    from importlib.metadata import version
    return version("jaxlib")
  except Exception:  # noqa: BLE001  (not installed: nothing to set)
    return None


def host_wants_flags() -> tuple[bool, str]:
  """``(True, '')`` when :data:`FLAGS` were measured to help on this host: an x86-64 CPU
  without AVX-512 and a jaxlib in :data:`JAXLIB_TESTED`; else ``(False, why not)``."""
  import platform
  if platform.machine().lower() not in ("x86_64", "amd64"):
    return False, f"not measured on {platform.machine()}"
  avx512 = _cpu_has_avx512()
  if avx512 is None:
    return False, "CPU features unknown"
  if avx512:
    return False, "AVX-512 CPU: XLA's YNN convolutions measured faster there"
  v = _jaxlib_version()
  if not v or not v.startswith(JAXLIB_TESTED):
    return False, f"jaxlib {v} not measured (tested: {', '.join(JAXLIB_TESTED)}x)"
  return True, ""


def apply(environ=None, flags: dict[str, str] | None = None) -> dict[str, str]:
  """Merges ``flags`` (default :data:`FLAGS`) into ``environ['XLA_FLAGS']``.

  Args:
    environ: the environment to edit (default ``os.environ``).
    flags: ``{flag name: value}`` without the leading ``--``.

  Returns:
    ``{name: value}`` of the flags added (empty when switched off, when JAX's backends have
    already started, or when the user set every one of them). Also kept for
    :func:`status`.

  Raises:
    ValueError: an unparsable ``XLA_FLAGS`` (unbalanced quotes), naming it.
  """
  environ = os.environ if environ is None else environ
  if flags is None:
    wanted, why = host_wants_flags()
    if not wanted:
      _STATUS.update(added={}, note=f"no flags for this host ({why})")
      return {}
    flags = FLAGS
  if environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
    _STATUS.update(added={}, note=f"off ({SWITCH}={environ.get(SWITCH)})")
    return {}
  if not flags:
    _STATUS.update(added={}, note="no flags chosen")
    return {}
  if backends_started():
    _STATUS.update(added={}, note="JAX's backends had started before fedjax_inv was "
                   "imported; XLA_FLAGS left as it was")
    return {}
  current = environ.get("XLA_FLAGS", "")
  try:
    have = _names(current)
  except ValueError as e:
    raise ValueError(f"XLA_FLAGS={current!r} cannot be parsed ({e}); fix its quoting, or "
                     f"set {SWITCH}=0.") from None
  added = {k: v for k, v in flags.items() if k not in have}
  if added:
    environ["XLA_FLAGS"] = " ".join([current.strip()] * bool(current.strip()) + [
        f"--{k}={v}" for k, v in added.items()])
  kept = sorted(set(flags) - set(added))
  _STATUS.update(added=dict(added),
                 note="applied" + (f"; the user's value kept for {kept}" if kept else ""))
  return dict(added)


def status() -> dict:
  """``{'added': {name: value}, 'note': str, 'xla_flags': the XLA_FLAGS in effect}``."""
  return dict(_STATUS, xla_flags=os.environ.get("XLA_FLAGS", ""))
