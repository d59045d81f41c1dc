"""FedCurv (Shoham et al. 2019): diagonal Fishers summed over the pool and the penalty
``λ Σ_{j≠i} F_j (θ − θ_j)²``. Factories: ``fedjax_inv/algorithms/fedilc.py``.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_inv import aggregators as aggs
from fedjax_inv.algorithms.fishr import _sum_over_examples, _zero_where  # noqa: F401
from fedjax_inv.core import losses
from fedjax_inv.core.algorithm import Component
from fedjax_inv.core.validation import nonneg as _nonneg, pos_int as _pos_int

PyTree = Any


# ---------------------------------------------------------------------------------------
# FedCurv (Shoham et al. 2019)
# ---------------------------------------------------------------------------------------


def diagonal_fisher(model, kind: str, params: PyTree, x, y, n, chunk: int = 64) -> PyTree:
  """Empirical diagonal Fisher information of one client at ``params``.

  ``F = (1/n) Σ_i (∇_θ ℓ_i(θ))²`` over the client's ``n`` real examples, with
  ``ℓ_i = −log p(y_i | x_i, θ)`` the per-example task loss at the observed label (the
  *empirical* Fisher, as FedCurv's and EWC's implementations compute it; for
  'regression' ``ℓ_i`` is the squared error, i.e. 2× the unit-variance Gaussian NLL up to a
  constant, so ``F`` is 4× that Gaussian Fisher). Per-example gradients are ``vmap``-ed in
  chunks of ``chunk`` examples (memory ``O(chunk × parameters)``).

  Args:
    model: ``FunctionalModel``; kind: task loss kind; params: pytree.
    x: ``[n_max, ...]`` padded inputs; y: ``[n_max]``; n: int32 true size.
    chunk: examples per vectorized chunk.

  Returns:
    Pytree shaped like ``params``, entries ``>= 0`` (units: loss² / parameter²).

  Raises:
    ValueError: unknown ``kind`` (from ``losses.per_example_loss``, while tracing).

  Source: Shoham et al. 2019 §3-4 (diag(I_{t,j}), the Fisher of EWC, Kirkpatrick et al.
  2017).
  """
  w = (jnp.arange(x.shape[0]) < n).astype(jnp.float32)

  def one(xi, yi, wi):
    keep = wi > 0
    xi = jnp.where(keep, xi, jnp.zeros_like(xi))

    def nll(p):
      return losses.per_example_loss(kind, model.apply(p, xi[None]), yi[None])[0]

    g = jax.grad(nll)(params)
    return jax.tree.map(lambda a: jnp.where(keep, wi * a * a, 0.0), g), wi

  total, wsum = _sum_over_examples(one, x, y, w, chunk)
  return jax.tree.map(lambda t: t / jnp.maximum(wsum, 1e-12), total)


def _sum_aggregator() -> aggs.Aggregator:
  """Plain sum over clients (a client with weight 0 contributes nothing)."""
  return aggs.Aggregator(
      lambda m, w: _zero_where(jnp.asarray(w) > 0, m), lambda s: s, "sum")


def fedcurv_penalty(params: PyTree, sums: dict, own: dict) -> jax.Array:
  """``Σ_{j≠i} Σ_k F_{j,k}(θ_k − θ̂_{j,k})²`` from pool sums, without a loop over ``j``.

  With ``U = Σ_j F_j``, ``V = Σ_j F_j θ̂_j``, ``W = Σ_j F_j θ̂_j²`` over every client's
  latest contribution (``sums``) and client ``i``'s own terms ``own``:
  ``θ²(U − F_i) − 2θ(V − F_iθ̂_i) + (W − F_iθ̂_i²)``, summed over all coordinates.

  Args:
    params: ``θ`` (pytree).
    sums, own: ``{'f', 'f_theta', 'f_theta2'}``, each a pytree shaped like ``params``.

  Returns:
    Scalar ``>= 0`` up to float32 cancellation (the expanded square; its gradient
    ``2[θ(U − F_i) − (V − F_iθ̂_i)]`` has no such cancellation).

  Source: Shoham et al. 2019, eq. for L̃_{t,s} and §4 (the server needs only the sums).
  """
  total = jnp.zeros((), jnp.float32)
  for th, u, v, ww, f, ft, ft2 in zip(
      jax.tree.leaves(params), jax.tree.leaves(sums["f"]), jax.tree.leaves(sums["f_theta"]),
      jax.tree.leaves(sums["f_theta2"]), jax.tree.leaves(own["f"]),
      jax.tree.leaves(own["f_theta"]), jax.tree.leaves(own["f_theta2"])):
    total = total + jnp.sum(th * th * (u - f) - 2.0 * th * (v - ft) + (ww - ft2))
  return total


def fedcurv_component(curv_lambda: float, fisher_chunk: int = 64) -> Component:
  """FedCurv's curvature penalty and its Fisher/model messages as an associative sum.

  * client loss term: ``λ · fedcurv_penalty(θ, server sums, own last contribution)``;
  * per-client state (pool ``[N, ...]``): the client's last contribution
    ``{'f': F_i, 'f_theta': F_iθ̂_i, 'f_theta2': F_iθ̂_i²}`` (zeros until it first
    participates, so never-seen clients contribute nothing);
  * ``message`` (after local training, at the final local params ``θ̂_i``): the new
    contribution minus the old one, with ``F_i = diagonal_fisher(θ̂_i)``; aggregated by a
    plain sum;
  * server state ``{'f': U, 'f_theta': V, 'f_theta2': W}`` += the summed differences, so
    it always holds the sums of every pool client's latest contribution (up to float32
    rounding accumulated over rounds).
  All clients of a round see the sums as they stood at the start of the round.

  Raises:
    ValueError: ``curv_lambda`` negative/not finite; ``fisher_chunk`` not a positive int.

  Source: Shoham et al. 2019 (FedCurv) §3-4.
  """
  lam = _nonneg("curv_lambda", curv_lambda)
  chunk = _pos_int("fisher_chunk", fisher_chunk)

  def zeros(params):
    z = lambda: jax.tree.map(jnp.zeros_like, params)  # noqa: E731
    return {"f": z(), "f_theta": z(), "f_theta2": z()}

  def loss(model, kind, params, batch, fwd, ctx, key):
    return lam * fedcurv_penalty(params, ctx.extras["fedcurv"], ctx.client["fedcurv"])

  def message(model, kind, params0, params, data, ctx, key, local_steps, lr):
    x, y, n = data
    f = diagonal_fisher(model, kind, params, x, y, n, chunk)
    new = {"f": f, "f_theta": jax.tree.map(jnp.multiply, f, params),
           "f_theta2": jax.tree.map(lambda a, t: a * t * t, f, params)}
    old = ctx.client["fedcurv"]
    return jax.tree.map(jnp.subtract, new, old), new

  def server_update(state, summed_diff, pseudo_grad, ctx):
    return jax.tree.map(jnp.add, state, summed_diff), pseudo_grad

  return Component(name="fedcurv", init_server=zeros, init_client=zeros, loss=loss,
                   message=message, aggregator=_sum_aggregator(),
                   server_update=server_update)
