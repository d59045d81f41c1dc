"""FedCurv (Shoham et al. 2019): diagonal Fishers summed over the pool and the penalty
``λ Σ_{j≠i} F_j (θ − θ_j)²`` (registry ``fedcurv_shoham``). FedILC's "FedCurv" baseline
(FedSGD + Fishr) is ``fedcurv`` in ``fedilc.py``; see docs/ALGORITHMS.md#fedcurv.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_inv.aggregation import aggregators as aggs
from fedjax_inv.algorithms import penalties
from fedjax_inv.algorithms import base
from fedjax_inv.algorithms.base import register
from fedjax_inv.algorithms.fedsgd_type import server_settings
from fedjax_inv.core import losses
from fedjax_inv.core.algorithm import WEIGHTINGS, Algorithm, Batch, Component
from fedjax_inv.core.validation import choice as _choice, nonneg as _nonneg
from fedjax_inv.core.validation import pos_int as _pos_int, positive as _positive

PyTree = Any


# ---------------------------------------------------------------------------------------
# FedCurv (Shoham et al. 2019)
# ---------------------------------------------------------------------------------------


def diagonal_fisher(model, kind: str, params: PyTree, batch: Batch, chunk: int = 64) -> PyTree:
  """Empirical diagonal Fisher information of one client at ``params``.

  ``F = (1/n) Σ_i (∇_θ ℓ_i(θ))²`` over the client's ``n`` real examples, with
  ``ℓ_i = −log p(y_i | x_i, θ)`` the per-example task loss at the observed label (the
  *empirical* Fisher, as FedCurv's and EWC's implementations compute it; for
  'regression' ``ℓ_i`` is the squared error, i.e. 2× the unit-variance Gaussian NLL up to a
  constant, so ``F`` is 4× that Gaussian Fisher). Per-example gradients are ``vmap``-ed in
  chunks of ``chunk`` examples (memory ``O(chunk × parameters)``).

  Args:
    model: ``FunctionalModel``; kind: task loss kind; params: pytree.
    batch: the client's data, ``Batch(x [n_max, ...], y [n_max], w [n_max])`` (``w``
      1.0 real, 0.0 padding).
    chunk: examples per vectorized chunk.

  Returns:
    Pytree shaped like ``params``, entries ``>= 0`` (units: loss² / parameter²).

  Raises:
    ValueError: unknown ``kind`` (from ``losses.per_example_loss``, while tracing).

  Source: Shoham et al. 2019 §3-4 (diag(I_{t,j}), the Fisher of EWC, Kirkpatrick et al.
  2017).
  """
  def one(xi, yi, wi):
    keep = wi > 0
    xi = jnp.where(keep, xi, jnp.zeros_like(xi))

    def nll(p):
      return losses.per_example_loss(kind, model.apply(p, xi[None]), yi[None])[0]

    g = jax.grad(nll)(params)
    return jax.tree.map(lambda a: jnp.where(keep, wi * a * a, 0.0), g), wi

  total, wsum = penalties.sum_over_examples(one, batch.x, batch.y, batch.w, chunk)
  return jax.tree.map(lambda t: t / jnp.maximum(wsum, 1e-12), total)


def _sum_aggregator() -> aggs.Aggregator:
  """Plain sum over clients (a client with weight 0 contributes nothing)."""
  return aggs.Aggregator(
      lambda m, w: penalties.zero_where(jnp.asarray(w) > 0, m), lambda s: s, "sum")


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

  def loss(params, ctx):
    return lam * fedcurv_penalty(params, ctx.extras["fedcurv"], ctx.client["fedcurv"])

  def contribution(model, kind, params, batch):  # the client's new state
    f = diagonal_fisher(model, kind, params, batch, chunk)
    return {"f": f, "f_theta": jax.tree.map(jnp.multiply, f, params),
            "f_theta2": jax.tree.map(lambda a, t: a * t * t, f, params)}

  def message(model, kind, params, batch, ctx):  # new contribution minus the old
    return jax.tree.map(jnp.subtract, contribution(model, kind, params, batch),
                        ctx.client["fedcurv"])

  def pool_sums(pseudo_grad, state, messages, ctx):  # server stage; pseudo-grad unchanged
    return pseudo_grad, jax.tree.map(jnp.add, state, messages["fedcurv"])

  return Component(name="fedcurv", loss=loss, init_client=zeros,
                   update_client=contribution, message=message,
                   aggregator=_sum_aggregator(), init_server=zeros, server_stage=pool_sums)


@register("fedcurv_shoham", paper="Shoham et al. 2019 (FedCurv)",
          summary="local training + lambda * sum_{j!=i} F_j (theta - theta_j)^2 from pool "
                  "sums of diagonal Fishers (Shoham et al.'s FedCurv), server Adam",
          fixed=("weight_decay", "local_epochs"))
def fedcurv_shoham(*, curv_lambda: float = 1.0, client_optimizer: str = "sgd",
                   client_lr: float = 1.0, local_steps: int = 1, batch_size=None,
                   client_weight_decay: float = 0.0, fisher_chunk: int = 64,
                   weighting: str = "num_examples", client_optimizer_state: str = "restart",
                   **kw) -> Algorithm:
  """Shoham et al.'s FedCurv: clients minimize ``L_i(θ) + λ Σ_{j≠i} Σ_k F_{j,k}(θ_k −
  θ̂_{j,k})²`` with the last local model ``θ̂_j`` and diagonal Fisher ``F_j`` of every
  pool client ``j`` that has participated (pool sums, ``fedcurv_component``); the
  pseudo-gradients are averaged (``weighting``) and go to FedILC's server optimizer.

  Defaults put it on FedILC's footing (one full-batch ``sgd(1.0)`` step, server Adam lr
  3e-4, wd 0.01); Shoham et al.'s own setting is FedAvg-type local training
  (``local_steps > 1``, smaller ``client_lr``, ``server_optimizer='sgd'``,
  ``server_lr=1``, ``weight_decay=0``). ``weight_decay`` is the *server's* (registered
  ``fixed``: a task's client weight decay is not routed to it; ``client_weight_decay`` is
  the clients').

  Args:
    curv_lambda: ``λ >= 0`` (not given by FedILC; 1.0 here).
    client_optimizer, client_lr, local_steps, batch_size, client_weight_decay: local
      training (``base.client_optimizer``: 'sgd' | 'momentum' | 'adam').
    fisher_chunk: examples per vectorized chunk of per-example gradients (memory only).
    weighting: 'num_examples' | 'uniform'.
    client_optimizer_state: 'restart' (default) | 'persistent'
      (``Algorithm.client_optimizer_state``).
    **kw: the server knobs of ``fedsgd_type.server_optimizer``.

  Raises:
    ValueError: any bad value (named, with the fix) or unknown keyword.

  Source: Shoham et al. 2019 §3-4; FedILC §5 (baseline, server Adam §5.1).
  """
  opt, hp = server_settings("fedcurv_shoham", kw, ("curv_lambda", "client_optimizer",
                            "client_lr", "local_steps", "client_weight_decay",
                            "fisher_chunk"))
  local_steps = _pos_int("local_steps", local_steps)
  batch_size = _pos_int("batch_size", batch_size, allow_none=True,
                        none_means="the full client data")
  cwd = _nonneg("client_weight_decay", client_weight_decay)
  _positive("client_lr", client_lr)
  _choice("weighting", weighting, WEIGHTINGS)
  copt = base.client_optimizer(client_optimizer, client_lr, weight_decay=cwd)
  comp = fedcurv_component(curv_lambda, fisher_chunk)
  hp = dict(curv_lambda=float(curv_lambda), client_optimizer=client_optimizer,
            client_lr=float(client_lr), local_steps=local_steps, batch_size=batch_size,
            client_weight_decay=cwd, fisher_chunk=int(fisher_chunk), weighting=weighting,
            aggregator="mean", **hp, client_optimizer_state=client_optimizer_state)
  return Algorithm(name="fedcurv_shoham", client_optimizer=copt, server_optimizer=opt,
                   local_steps=local_steps, batch_size=batch_size,
                   aggregator=aggs.weighted_mean(), weighting=weighting,
                   components=(comp,), hparams=hp,
                   client_optimizer_state=client_optimizer_state)
