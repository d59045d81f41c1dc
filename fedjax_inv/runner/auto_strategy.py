"""``execution='auto'`` chosen by measurement, with a cache.

The engine's fixed rule (``core.memory.auto_strategy``: ``scan`` on one CPU device,
else ``vmap``, ``chunked`` when the memory estimate says so) is wrong in measured cases
(``chunked`` 2.3x faster than ``vmap`` on an H100 at C=100). So a run's ``auto``:

1. **cache hit**: the strategy measured earlier for the same round (key: the data shapes,
   pool and cohort sizes, the algorithm and its hyperparameters, the model's parameter
   shapes, the device kind and count, the JAX and jaxlib versions) is used, with no
   measurement;
2. **cache miss, short run** (``rounds < MEASURE_MIN_ROUNDS``): the fixed rule, no
   measurement (compiling the other candidates would cost more than they can save, so a
   10-round run is never slower than before);
3. **cache miss, long run**: every candidate that fits in memory (:func:`candidates`:
   'scan', 'vmap', and 'chunked' for cohorts above ``CHUNK_MIN_COHORT``; on a GPU or
   TPU, for a model with convolutions, also 'vmap+patches' and 'chunked+patches') is
   built and compiled, then timed
   for ``PROBE_ROUNDS`` rounds from the initial state, ``REPEATS`` times, interleaved
   (scan, vmap, chunked, scan, ...), so that a burst of background load hits every
   candidate alike; the median of each is compared, the fastest kept and cached.
   The timed rounds are thrown away: the run itself starts from its own initial state.

``execution='rule'`` skips all of this (the fixed rule); ``'probe'`` measures even on a
cache hit (and refreshes the cache). Every run records the choice
(``RunResult.probe`` -> summary.json ``execution_probe``: ``chosen``, ``by`` =
'cache' | 'measured' | 'rule', the medians, the cache file). A strategy changes float32
summation order only, so two runs with the same seed are bit-identical when they ran
the same strategy; pin it (``--execution scan``) to compare across machines or caches.

The cache is one JSON file, ``auto_strategy.json``, in ``$FEDJAX_INV_CACHE_DIR``, else
``$XDG_CACHE_HOME/fedjax_inv``, else ``~/.cache/fedjax_inv``; written atomically; an
unreadable file is ignored (and replaced on the next write). The Python loop over one
compiled client update (the benchmarks' ``loop`` baseline) is not a candidate: it is not
an engine strategy, and ``bench --quick`` measured it slower than the engine's choice in
every row (``benchmarks/RESULTS.md``).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from fedjax_inv.core import strategy as strategy_lib
from fedjax_inv.runner import outputs

MEASURE_MIN_ROUNDS = 50
PROBE_ROUNDS = 2  # timed rounds per candidate and repeat
REPEATS = 3  # interleaved repeats per candidate; the median is compared
CHUNK_MIN_COHORT = 64  # 'chunked' is a candidate above this cohort (chunks of 64)
CACHE_FILE = "auto_strategy.json"
MODES = ("auto", "probe", "rule")
# Backends on which the 'patches' form of a model's convolutions (core.strategy.CONV_FORMS)
# is a candidate. Not the CPU: measured there (2-core AMD EPYC, JAX 0.10.2, models.cnn(1)
# FedAvg, 5 local steps of batch 32; benchmarks/results_conv_forms_cpu.json), 'scan' beat
# every patches candidate about twice: C=10 scan 0.43 s per round, vmap+patches 0.84 s,
# vmap 2.7 s; C=100 scan 4.2 s, chunked+patches 9.1 s, chunked 35.5 s. Timing them there
# would only add compiles.
PATCHES_BACKENDS = ("gpu", "cuda", "rocm", "tpu")


def candidates(cohort: int, model, feature_shape, backend: str | None = None) -> list:
  """The strategies 'auto' times for a round of ``cohort`` clients of ``model`` on
  inputs of ``feature_shape``: 'scan', 'vmap', 'chunked' above ``CHUNK_MIN_COHORT``
  clients, and on a backend of :data:`PATCHES_BACKENDS` (default: JAX's) with a model
  that has convolutions (``core.memory.uses_convolution``) each batched one again with
  its convolutions in the patches form ('vmap+patches', 'chunked+patches')."""
  from fedjax_inv.core import memory
  out = ["scan", "vmap"] + (["chunked"] if cohort > CHUNK_MIN_COHORT else [])
  if ((backend or jax.default_backend()) in PATCHES_BACKENDS
      and memory.uses_convolution(model, feature_shape)):
    out += [s + strategy_lib.PATCHES for s in out if s != "scan"]
  return out


def cache_path() -> pathlib.Path:
  """The cache file (module docstring)."""
  base = os.environ.get("FEDJAX_INV_CACHE_DIR")
  if not base:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    base = os.path.join(xdg, "fedjax_inv")
  return pathlib.Path(base) / CACHE_FILE


def round_key(task, model, algorithm, cohort: int, num_devices: int) -> dict:
  """What a round's speed depends on, as a JSON-able dict (the cache key's fields)."""
  params = jax.eval_shape(lambda: model.init(0))
  shapes = sorted((jax.tree_util.keystr(p), tuple(a.shape), str(a.dtype))
                  for p, a in jax.tree_util.tree_leaves_with_path(params))
  import jaxlib
  dev = jax.devices()[0]
  return {"feature_shape": list(task.train.feature_shape), "n_max": int(task.train.n_max),
          "num_clients": int(task.train.num_clients), "cohort": int(cohort),
          "kind": task.kind, "algorithm": algorithm.name,
          "hparams": json.dumps(algorithm.hparams, sort_keys=True, default=str),
          "model": hashlib.sha1(repr(shapes).encode()).hexdigest()[:16],
          "platform": dev.platform, "device_kind": dev.device_kind,
          "num_devices": int(num_devices), "jax": jax.__version__,
          "jaxlib": jaxlib.__version__,
          # the run's matmul precision (simulation.matmul_precision): TF32 or bfloat16
          # products change a GPU's speed
          "matmul_precision": str(jax.config.jax_default_matmul_precision)}


def _digest(key: dict) -> str:
  return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _read(path: pathlib.Path) -> dict:
  try:
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}
  except (OSError, ValueError):
    return {}


def cached(key: dict) -> dict | None:
  """The cached entry of ``key`` (``{'chosen', 'seconds_per_round', ...}``) or None."""
  entry = _read(cache_path()).get(_digest(key))
  return entry if isinstance(entry, dict) and entry.get("key") == key else None


def store(key: dict, chosen: str, seconds: dict) -> pathlib.Path:
  """Adds (or replaces) ``key``'s entry in the cache file, atomically."""
  path = cache_path()
  data = _read(path)
  data[_digest(key)] = {"key": key, "chosen": chosen, "seconds_per_round": seconds,
                        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
  outputs.write_json(path, data)
  return path


def measure(build, candidates, server, cstates, data, rounds: int = PROBE_ROUNDS,
            repeats: int = REPEATS) -> tuple:
  """Times each candidate strategy on the real round.

  Args:
    build: ``build(strategy) -> round_fn`` (a jitted round), raising
      ``core.memory.DoesNotFitError`` for a strategy that does not fit.
    candidates: strategy names.
    server, cstates, data: the run's initial state and client data (not modified: each
      candidate starts from a copy).
    rounds: timed rounds per candidate and repeat.
    repeats: interleaved repeats; the median is kept.

  Returns:
    ``(built {strategy: round_fn}, {strategy: median seconds per round})``; candidates
    that do not fit are left out.
  """
  from fedjax_inv.core import memory
  key = jax.random.key(0)
  copy = lambda t: jax.tree.map(lambda a: jnp.array(a, copy=True), t)  # noqa: E731
  built, states = {}, {}
  for c in candidates:
    try:
      fn = build(c)
    except memory.DoesNotFitError:
      continue
    st = fn(server, copy(cstates), data, key)[:2]  # compiles
    jax.block_until_ready(st)
    built[c], states[c] = fn, st
  times = {c: [] for c in built}
  for _ in range(repeats):
    for c, fn in built.items():  # interleaved: load bursts hit every candidate alike
      st = states[c]
      t = time.perf_counter()
      for _ in range(rounds):
        st = fn(*st, data, key)[:2]
      jax.block_until_ready(st)
      times[c].append((time.perf_counter() - t) / rounds)
      states[c] = st
  return built, {c: statistics.median(v) for c, v in times.items()}


def choose(mode: str, task, model, algorithm, cohort: int, rounds: int, build,
           server, cstates, num_devices: int = 1, stream=None) -> tuple:
  """The run's round function and its record (module docstring).

  Args:
    mode: 'auto' | 'probe' | 'rule'.
    task: the run's task (its client data are timed on).
    model: the run's model (the algorithm's transform applied).
    algorithm: the run's algorithm.
    cohort: clients per round.
    rounds: the run's rounds (a short run is not measured on a cache miss).
    build: ``build(strategy) -> round_fn``; ``build('auto')`` is the fixed rule.
    server: an initial server state to time rounds from.
    cstates: the matching initial client states.
    num_devices: devices the client axis is sharded over.
    stream: where the one-line choice is printed (default stderr); None prints nothing
      for 'rule'.

  Returns:
    ``(round_fn, record)``; record: ``{'chosen', 'by', 'seconds_per_round', 'cache'}``.

  Raises:
    ValueError: an unknown ``mode``.
    core.memory.DoesNotFitError: no candidate fits in memory.
  """
  from fedjax_inv.core import memory
  if mode not in MODES:
    raise ValueError(f"execution mode {mode!r}; choose one of {MODES}.")
  stream = stream or sys.stderr
  if mode == "rule":
    fn = build("auto")
    return fn, {"chosen": strategy_lib.execution_name(fn), "by": "rule",
                "seconds_per_round": {}}
  key = round_key(task, model, algorithm, cohort, num_devices)
  hit = cached(key) if mode == "auto" else None
  if hit is not None:
    try:
      fn = build(hit["chosen"])
    except memory.DoesNotFitError:
      hit = None  # the budget changed since: measure again
    else:
      print(f"execution auto: {hit['chosen']} (cached measurement, {cache_path()})",
            file=stream)
      return fn, {"chosen": hit["chosen"], "by": "cache",
                   "seconds_per_round": hit["seconds_per_round"], "cache": str(cache_path())}
  if mode == "auto" and rounds < MEASURE_MIN_ROUNDS:
    fn = build("auto")
    return fn, {"chosen": strategy_lib.execution_name(fn), "by": "rule", "seconds_per_round": {},
                "why": f"{rounds} rounds < {MEASURE_MIN_ROUNDS}: too short to pay for "
                       "measuring (fixed rule)"}
  built, times = measure(build, candidates(cohort, model, task.train.feature_shape),
                         server, cstates, task.train)
  if not built:
    raise memory.DoesNotFitError(f"execution={mode!r}: no strategy fits in memory; "
                                 "lower clients_per_round.")
  chosen = min(times, key=times.get)
  path = store(key, chosen, times)
  print(f"execution {mode}: {chosen} (measured, median s/round: "
        + ", ".join(f"{c} {t:.4g}" for c, t in times.items()) + f"; cached in {path})",
        file=stream)
  return built[chosen], {"chosen": chosen, "by": "measured", "seconds_per_round": times,
                         "cache": str(path)}
