"""Execution-strategy settings shared by the round engine (``engine.py``) and its memory
estimate (``memory.py``), so that neither imports the other.

Tunables are read at build/trace time from this module (``strategy.SCAN_UNROLL``), so
setting them here changes both the engine and the estimate.
"""
from __future__ import annotations

import contextlib
import contextvars
import math

# The strategies a round can run under; "auto" picks one of them per workload.
CONCRETE_STRATEGIES = ("vmap", "scan", "chunked")
# How a model's convolutions are computed, read when a round is traced
# (``fedjax_inv.models.conv.conv_general_dilated``): 'lax' is XLA's convolution, which
# vmapped over the clients' own weights becomes one grouped convolution with a group per
# client; 'patches' is the input's patches (im2col) times the kernel as one matrix
# product, which vmapped over clients becomes one batched matrix product.
CONV_FORMS = ("lax", "patches")
PATCHES = "+patches"  # a strategy's suffix for the 'patches' form, e.g. 'vmap+patches'
PATCHED_STRATEGIES = ("vmap" + PATCHES, "chunked" + PATCHES)
STRATEGIES = ("auto", *CONCRETE_STRATEGIES, *PATCHED_STRATEGIES)


def split_execution(execution: str) -> tuple[str, str]:
  """``'vmap+patches' -> ('vmap', 'patches')``, ``'scan' -> ('scan', 'lax')``: a strategy
  name as the strategy of the client axis and the convolution form (:data:`CONV_FORMS`).
  Names are not validated here (the engine does that)."""
  if execution.endswith(PATCHES):
    return execution[:-len(PATCHES)], "patches"
  return execution, "lax"


def base_strategy(backend: str | None = None, num_devices: int | None = None) -> str:
  """The strategy ``execution='auto'`` starts from, before the data shapes are known:
  'scan' on one CPU device, else 'vmap'. ``backend`` (default: JAX's) and
  ``num_devices`` (default: every device JAX sees) describe where the round runs. The
  measurements behind it are in ``engine.resolve_strategy``; ``memory.auto_strategy``
  refines 'vmap' once the shapes are known. No errors are raised."""
  import jax  # this module otherwise stays free of JAX
  backend = backend or jax.default_backend()
  num_devices = num_devices or jax.device_count()
  return "scan" if backend == "cpu" and num_devices == 1 else "vmap"


def execution_name(round_fn) -> str:
  """The ``execution`` name that rebuilds a round: its ``execution`` attribute
  (``engine.build_round``'s rounds: 'vmap+patches', 'scan', ...), else its ``strategy``
  (a round object built another way, which names only that)."""
  return getattr(round_fn, "execution", round_fn.strategy)


_CONV_FORM = contextvars.ContextVar("fedjax_inv_conv_form", default="lax")


@contextlib.contextmanager
def conv_form(form: str):
  """Within the block, convolutions traced through ``models.conv.conv_general_dilated``
  take the form ``form`` (:data:`CONV_FORMS`). Programs already traced keep theirs.

  Raises:
    ValueError: ``form`` is not in :data:`CONV_FORMS`.
  """
  if form not in CONV_FORMS:
    raise ValueError(f"conv form {form!r}; choose one of {CONV_FORMS}.")
  token = _CONV_FORM.set(form)
  try:
    yield
  finally:
    _CONV_FORM.reset(token)


def current_conv_form() -> str:
  """The convolution form in force (:func:`conv_form`; 'lax' outside any block)."""
  return _CONV_FORM.get()


# Under 'scan', the pre-stage (messages at the shared global model: forward passes, no
# per-client weights) runs vmapped in chunks of this many clients, so a forward pass
# batches into one larger matmul (measured, fishr_inter_geo C=200 on 2 CPU cores:
# 0.137-0.140 s per round vs 0.153 s with the pre-stage under 'scan'). None = 'scan'.
PRE_CHUNK = 8
SCAN_UNROLL = 4  # clients per 'scan' loop iteration; see benchmarks/RESULTS.md
# Per-client bytes up to which all K minibatches are gathered before the local-step scan
# (one gather instead of K: measured ~1.5x faster rounds for the MNIST MLP on CPU).
PREGATHER_BYTES = 16 * 2**20
# Local steps per iteration of the local-training loop; None = all of them (fully
# unrolled) on CPU when local_steps <= LOCAL_UNROLL_MAX, else 1.
LOCAL_UNROLL = None
LOCAL_UNROLL_MAX = 16


def pregathered(local_steps: int, batch_size: int, example_bytes: int) -> bool:
  """True when a client's ``local_steps`` minibatches of ``batch_size`` examples of
  ``example_bytes`` bytes each are gathered at once before the local-step loop (the
  engine's rule, which the memory estimate reads)."""
  return local_steps * batch_size * example_bytes <= PREGATHER_BYTES


# Poisson client sampling: the cohort buffer holds the expected C clients plus this many
# standard deviations of the Binomial(N, C/N) count (and one), so a round has more
# sampled clients than slots with probability below 3e-7 (the extra ones are left out;
# the round's 'cohort_size' metric counts the clients it ran).
POISSON_MARGIN_SD = 5.0


def poisson_slots(num_clients: int, cohort: int) -> int:
  """Client slots of a round with Poisson sampling at rate ``q = cohort / num_clients``:
  ``min(N, C + ceil(POISSON_MARGIN_SD * sqrt(C (1 - q))) + 1)``."""
  q = cohort / num_clients
  extra = math.ceil(POISSON_MARGIN_SD * math.sqrt(cohort * (1.0 - q))) + 1
  return int(min(num_clients, cohort + extra))


def largest_divisor_at_most(n: int, k: int) -> int:
  """The largest divisor of ``n`` that is ``<= k`` (and >= 1): the clients per chunk of
  the 'chunked' strategy for a cohort of ``n`` and a requested ``chunk_size`` ``k``."""
  k = max(1, min(n, k))
  while n % k:
    k -= 1
  return k


def local_unroll(local_steps: int) -> int:
  """Local steps per iteration of the local-training ``lax.scan``. On CPU short local
  loops are unrolled (measured, MNIST MLP, 20 clients × 5 steps under 'scan': 14 ms vs
  22 ms per round rolled; the ConvNet gains ~5 %); elsewhere the loop stays rolled (fast
  compile)."""
  import jax
  if LOCAL_UNROLL is not None:
    return max(1, min(LOCAL_UNROLL, local_steps))
  if jax.default_backend() == "cpu" and local_steps <= LOCAL_UNROLL_MAX:
    return local_steps
  return 1
