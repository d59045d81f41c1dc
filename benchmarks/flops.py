"""FLOP counting and matmul rooflines for ``fedjax-inv bench``.

* :func:`count_flops`: FLOPs of one call, counted from its jaxpr with loop trip counts
  (XLA's ``cost_analysis()`` counts a loop body once); :func:`loop_flops` for the
  ``loop`` baseline's compiled pieces; :func:`xla_flops_local`: XLA's own count for one
  local step × ``K``, reported beside it.
* :func:`measure_matmul_peak`: the machine's measured f32 matmul peak (large squares);
  :func:`measure_shape_peak` with :func:`mlp_step_shapes`: the roofline of the MLP step's
  small matmuls.

All timings use ``time.perf_counter`` around a call followed by ``block_until_ready``.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable

from fedjax_inv.core.memory import sub_jaxprs

from .workloads import LOCAL, NUM_CLASSES

if TYPE_CHECKING:
  from .loop_round import LoopRound

_ELEMENTWISE = frozenset((
    "add", "sub", "mul", "div", "max", "min", "neg", "exp", "exp2", "log", "log1p",
    "tanh", "logistic", "sqrt", "rsqrt", "pow", "integer_pow", "abs", "sign", "square",
    "expm1", "erf", "sin", "cos", "select_n", "clamp", "add_any", "rem", "atan2"))
_REDUCTIONS = frozenset(("reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin",
                         "cumsum", "reduce_prod"))


def _size(v) -> int:
  shape = getattr(getattr(v, "aval", None), "shape", None)
  return math.prod(shape) if shape is not None else 0


def _jaxpr_flops(jaxpr, while_trips: int = 1) -> float:
  total = 0.0
  rec = lambda j: _jaxpr_flops(j, while_trips)  # noqa: E731
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (lc, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * _size(eqn.outvars[0]) * math.prod(lhs[d] for d in lc)
    elif name == "conv_general_dilated":
      rhs = eqn.invars[1].aval.shape
      spec = eqn.params["dimension_numbers"].rhs_spec
      total += 2.0 * _size(eqn.outvars[0]) * rhs[spec[1]] * math.prod(
          rhs[d] for d in spec[2:])
    elif name == "scan":
      total += eqn.params["length"] * rec(eqn.params["jaxpr"].jaxpr)
    elif name == "cond":
      total += max(rec(b.jaxpr) for b in eqn.params["branches"])
    elif name == "while":
      total += while_trips * (rec(eqn.params["body_jaxpr"].jaxpr)
                              + rec(eqn.params["cond_jaxpr"].jaxpr))
    elif name in _ELEMENTWISE:
      total += sum(_size(v) for v in eqn.outvars)
    elif name in _REDUCTIONS:
      total += sum(_size(v) for v in eqn.invars)
    else:
      total += sum(rec(s) for s in sub_jaxprs(eqn))
  return total


def count_flops(fn: Callable, *args, while_trips: int = 1) -> float:
  """Floating-point operations of ``fn(*args)``, counted from its jaxpr (no compile).

  ``dot_general``: ``2·|out|·Π contracted dims``; ``conv_general_dilated``:
  ``2·|out|·C_in/groups·Π kernel dims``; elementwise arithmetic: one per output element;
  reductions: one per input element; ``scan`` bodies × ``length``; ``cond``: the
  costliest branch; ``while`` bodies ``while_trips`` times (the trip count is not in
  the jaxpr: 1 by default; the local steps of a ``local_epochs`` recipe, whose clients
  train in a ``while_loop``, for a round). Unlike XLA's
  ``compiled.cost_analysis()['flops']``, which counts each loop body once, this makes
  'scan', 'chunked' and 'vmap' rounds count the same work. ``args`` may be arrays or
  ``jax.ShapeDtypeStruct``.

  Returns:
    float FLOPs of one call.
  """
  import jax
  return _jaxpr_flops(jax.make_jaxpr(fn)(*args).jaxpr, while_trips)


def loop_flops(loop: LoopRound, server, client_states, data, key,
               while_trips: int = 1) -> float:
  """FLOPs of one ``loop`` round from the jaxprs of its compiled pieces
  (:func:`count_flops`, each times the number of calls per round; compiles ``loop``
  first if needed)."""
  return sum(n * count_flops(fn, *args, while_trips=while_trips)
             for n, fn, args in loop.pieces(server, client_states, data, key))


def xla_flops_local(model, kind, algorithm, data, server) -> float | None:
  """``C``-independent part: XLA cost_analysis flops of ONE client's local training with
  one local step (a loop body counted once = exactly one step), times ``K`` (the local
  steps; ``E * ceil(n / B)`` for a ``local_epochs`` recipe).

  Returns None (never raises) when a component keeps client state or XLA's cost analysis
  fails: the count is best effort.
  """
  import jax
  import jax.numpy as jnp
  from fedjax_inv.core import engine
  from fedjax_inv.core.algorithm import Context
  if any(c.init_client is not None for c in algorithm.components):
    return None
  # No component with client state, so none depends on K: one step of the same recipe.
  alg1 = algorithm.replace(local_steps=1, hparams={**algorithm.hparams, "local_steps": 1})
  ctx = Context(params=server.params, round=server.round, extras=server.extras, client={},
                num_clients=jnp.float32(1), cohort=jnp.float32(1))

  def one(x, y, n, key):
    return engine.local_train(model, kind, alg1, ctx, x, y, n, key)[0]
  try:
    ca = jax.jit(one).lower(data.x[0], data.y[0], data.n[0], jax.random.key(0)).compile()
    ca = ca.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    # K: local_steps, or E * ceil(n / B) under local_epochs (a while_loop, body once)
    from fedjax_inv.core.client import max_client_steps
    return float(ca.get("flops", 0.0)) * max_client_steps(algorithm, data.x.shape[1])
  except Exception:  # cost analysis is best effort
    return None


def measure_matmul_peak(n: int = 2048, reps: int = 5) -> float:
  """The machine's measured f32 matmul throughput in FLOP/s: best of ``reps`` timed
  ``jnp.dot`` of two ``[n, n]`` float32 matrices (``2 n³`` FLOPs each), after one
  compile-and-warm-up call.

  Raises:
    ValueError: ``n < 1`` or ``reps < 1``.
  """
  import jax
  import jax.numpy as jnp
  if n < 1 or reps < 1:
    raise ValueError(f"measure_matmul_peak: n={n}, reps={reps}; both must be >= 1.")
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  dot(a, b).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    dot(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n ** 3 / best


def mlp_step_shapes(batch: int = LOCAL["batch_size"], sizes=(784, 128, NUM_CLASSES)
                    ) -> list[tuple[int, int, int]]:
  """``(m, k, n)`` of the matmuls in one SGD step of the MLP ``sizes`` on ``batch``
  examples: per layer ``d_in → d_out`` the forward ``[B, d_in] @ [d_in, d_out]``, the
  weight gradient ``[d_in, B] @ [B, d_out]`` and, above the first layer, the input
  gradient ``[B, d_out] @ [d_out, d_in]``."""
  out = []
  for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
    out += [(batch, a, b), (a, batch, b)] + ([(batch, b, a)] if i else [])
  return out


def measure_shape_peak(shapes, iters: int = 500, reps: int = 3) -> float:
  """f32 FLOP/s of XLA running just the matmuls ``shapes`` (``(m, k, n)`` each) back to
  back, ``iters`` times inside one ``lax.fori_loop`` (best of ``reps`` timed calls after a
  warm-up): the matmul roofline of a workload made of small matrices, which on CPU is far
  below :func:`measure_matmul_peak`'s large-square number. Each iteration writes one
  element of every left operand from the loop carry, so nothing is hoisted out.

  Raises:
    ValueError: an empty ``shapes``, a non-positive dimension, ``iters < 1``, ``reps < 1``.
  """
  import jax
  import jax.numpy as jnp
  shapes = [tuple(int(d) for d in s) for s in shapes]
  if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes) or iters < 1 or reps < 1:
    raise ValueError(f"measure_shape_peak: shapes={shapes}, iters={iters}, reps={reps}; "
                     "give (m, k, n) triples of positive ints and iters, reps >= 1.")
  mats = [(jnp.full((m, k), 0.5, jnp.float32), jnp.full((k, n), 0.5, jnp.float32))
          for m, k, n in shapes]

  def body(_, carry):
    acc, ops = carry
    new = []
    for a, b in ops:
      a = a.at[0, 0].set(acc * 1e-30)
      acc = acc + jnp.dot(a, b)[0, 0] * 1e-30
      new.append((a, b))
    return acc, new

  run = jax.jit(lambda ops: jax.lax.fori_loop(0, iters, body, (jnp.float32(0), ops))[0])
  run(mats).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    run(mats).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return sum(2.0 * m * k * n for m, k, n in shapes) * iters / best
