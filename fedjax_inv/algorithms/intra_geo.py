"""FedILC §3.3 / Alg. 2: the intra-silo weighted geometric mean of per-example (or
mini-batch) gradients as a gradient estimator, with the dense-chain closed form.
Factories: ``fedjax_inv/algorithms/fedilc.py``.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_inv.aggregation import aggregators as aggs
from fedjax_inv.algorithms import penalties
from fedjax_inv.core import losses
from fedjax_inv.core.algorithm import Batch, Component
from fedjax_inv.core.validation import choice as _choice, pos_int as _pos_int

PyTree = Any

ZEROS = ("both", "negative")


# ---------------------------------------------------------------------------------------
# Intra-silo weighted geometric mean (FedILC §3.3, Alg. 2)
# ---------------------------------------------------------------------------------------


def intra_geo_component(groups: int | None = None, chunk: int = 64,
                        zeros: str = "both", group_size: int | None = None,
                        shuffle: bool = False) -> Component:
  """Client gradient = weighted geometric mean over environments inside the client.

  A ``grad_estimator``: given the minibatch ``batch`` (``x [B, ...]``, ``y [B]``, ``w [B]``
  with 1 = real, 0 = padding), returns ``(loss, grads)`` with

  * ``groups=None`` (Alg. 2, each example an environment): ``grads = wgm_i ∇ℓ_i`` over
    the real examples, ``∇ℓ_i`` the gradient of the client objective on the single
    example ``i`` (``value_and_grad_fn`` on a one-example batch, ``vmap``-ed in chunks
    of ``chunk`` examples, summed with ``lax.scan``);
  * ``groups=m`` (FedILC §5's scalable solution): the real examples, in their stored
    order, are cut into ``m`` contiguous groups of sizes differing by at most one
    (example of rank ``r`` among ``n`` real ones goes to group ``⌊r·m/n⌋``);
    ``grads = wgm_j ∇L_j`` over the non-empty groups, ``L_j`` the group's mean loss.
    With ``batch_size`` set, each local step's batch is a fresh uniform sample, so the
    groups are random mini-batches; with the full client batch they are fixed slices
    (sub-environments stored contiguously become groups).
  * ``group_size=s`` (FedILC's official code: the client's DataLoader mini-batches, batch
    32 on Color-MNIST, 64 on Rotated-CIFAR10 / eICU): the real examples are cut into
    ``⌈n/s⌉`` mini-batches of ``s`` examples (the last one smaller, like a DataLoader
    with ``drop_last=False``); with ``shuffle=True`` the order is a fresh uniform
    permutation every call (``DataLoader(shuffle=True)``; drawn from ``key``), otherwise
    the stored order. The examples are gathered into ``[⌈B/s⌉, s, ...]`` blocks, so the
    cost is one forward/backward pass over the batch. ``group_size`` wins over
    ``groups``; ``shuffle`` applies to ``group_size`` only.

  ``loss`` is the weighted mean of the per-example (per-group) losses, i.e. the batch's
  mean loss.

  Padding and zeros: the geometric mean is computed in its monoid form
  (``aggregators.geometric_mean_aggregator(zeros)``: per-sign counts and sums of
  ``log|g|``); a padded example (weight 0) or an empty group is lifted with weight 0, and
  its inputs and gradient are replaced by zeros first, so it contributes nothing — not
  even to ``|E|`` — whatever its stored values. ``zeros`` is the convention for exact
  zero gradients (``'both'``: the paper's E± both contain it, so one zero makes that
  coordinate 0; ``'negative'``: FedILC's code, zero counts only in E−, without its 1e-10
  log offset). Note that per-example gradients of ReLU networks have many exact zeros
  (inactive units, zero input pixels).

  Dense models: when ``objective.task_only`` (the client objective is the task loss
  alone) and ``objective.model`` has a ``dense_chain`` (``models.mlp``),
  the per-example mode is computed in closed form by ``_dense_per_example_wgm``: the same
  statistics from matmuls of layer inputs and pre-activation gradients, without
  materializing per-example gradients.

  Shapes: ``grads`` has the parameters' structure; memory per client
  ``O(chunk × parameters)`` (per-example) or ``O(m × batch activations)`` (groups) —
  times the cohort under the 'vmap' strategy.

  Raises:
    ValueError: ``groups`` / ``group_size`` not None / a positive int; ``chunk`` not a
      positive int; ``zeros`` not in ('both', 'negative'); ``shuffle`` not a bool.

  Source: FedILC §3.3, Alg. 2 (ClientUpdates), §5 (mini-batch geometric mean); §3.1
  (weightedgeo).
  """
  groups, group_size, chunk = _checked_settings(groups, chunk, zeros, group_size, shuffle)
  agg = aggs.geometric_mean_aggregator(zeros)

  def grad_estimator(objective, params, batch, key):
    w = batch.w.astype(jnp.float32)
    if group_size is not None:
      stats, loss_sum, wsum = _minibatch_group_stats(agg, group_size, shuffle, objective,
                                                     params, batch, key)
      return loss_sum / jnp.maximum(wsum, 1e-12), agg.finalize(stats)
    if groups is None and objective.task_only and getattr(objective.model, "dense_chain",
                                                           None):
      return _dense_per_example_wgm(objective.model, objective.kind, params, batch, agg,
                                    zeros)
    if groups is None:
      stats, loss_sum, wsum = penalties.sum_over_examples(
          _per_example_stats(agg, objective, params, key), batch.x, batch.y, w, chunk)
    else:
      stats, loss_sum, wsum = _contiguous_group_stats(agg, groups, objective, params, batch,
                                                      w, key)
    grads = agg.finalize(stats)
    return loss_sum / jnp.maximum(wsum, 1e-12), grads

  return Component(name="intra_geo", grad_estimator=grad_estimator)


def _checked_settings(groups, chunk, zeros, group_size, shuffle):
  """``intra_geo_component``'s arguments checked in order: ``(groups, group_size, chunk)``."""
  groups = _pos_int("intra_groups", groups, allow_none=True,
                    none_means="one environment per example")
  group_size = _pos_int("intra_group_size", group_size, allow_none=True,
                        none_means="use intra_groups / per example")
  if not isinstance(shuffle, bool):
    raise ValueError(f"intra_shuffle={shuffle!r}; use True or False.")
  chunk = _pos_int("intra_chunk", chunk)
  _choice("zeros", zeros, ZEROS)
  return groups, group_size, chunk


def _lifted_group(agg, loss, g, size):
  """One group's ``(lifted geo stats, size * loss, size)``; an empty group contributes 0."""
  keep = size > 0
  return (agg.lift(penalties.zero_where(keep, g), size),
          size * jnp.where(keep, loss, 0.0), size)


def _summed(out):
  """Sums every leaf of vmapped per-group outputs over the group axis 0."""
  return jax.tree.map(lambda a: jnp.sum(a, axis=0), out)


def _per_example_stats(agg, value_and_grad_fn, params, key):
  """The per-example ``(lifted stats, w*loss, w)`` function for ``sum_over_examples``."""
  def one(xi, yi, wi):
    keep = wi > 0
    xi = jnp.where(keep, xi, jnp.zeros_like(xi))
    loss, g = value_and_grad_fn(params, Batch(x=xi[None], y=yi[None], w=wi[None]), key)
    g = penalties.zero_where(keep, g)
    loss = jnp.where(keep, loss, 0.0)
    return agg.lift(g, wi), wi * loss, wi
  return one


def _minibatch_group_stats(agg, group_size, shuffle, value_and_grad_fn, params, batch, key):
  """Summed stats over ``[⌈B/group_size⌉, group_size, ...]`` mini-batches of real examples."""
  w = batch.w.astype(jnp.float32)
  b = w.shape[0]
  real = w > 0
  if shuffle:
    u = jax.random.uniform(jax.random.fold_in(key, 0x16C), (b,))
    order = jnp.argsort(jnp.where(real, u, 2.0))  # real examples first, random order
  else:
    order = jnp.argsort(jnp.where(real, jnp.arange(b), b + jnp.arange(b)))
  ng = -(-b // group_size)
  pad = ng * group_size - b

  def blocks(a, fill=0):
    a = a[order]
    if pad:
      a = jnp.concatenate([a, jnp.full((pad,) + a.shape[1:], fill, a.dtype)])
    return a.reshape((ng, group_size) + a.shape[1:])

  xs, ys, ws = blocks(batch.x), blocks(batch.y), blocks(w)

  def group(xg, yg, wg):
    size = jnp.sum(wg)
    xg = jnp.where((wg > 0).reshape((-1,) + (1,) * (xg.ndim - 1)), xg,
                   jnp.zeros_like(xg))
    loss, g = value_and_grad_fn(params, Batch(x=xg, y=yg, w=wg), key)
    return _lifted_group(agg, loss, g, size)

  return _summed(jax.vmap(group)(xs, ys, ws))


def _contiguous_group_stats(agg, groups, objective, params, batch, w, key):
  """Summed stats over ``groups`` contiguous, near-equal groups of the real examples."""
  real = w > 0
  rank = jnp.cumsum(real.astype(jnp.int32)) - 1
  n_real = jnp.maximum(jnp.sum(real.astype(jnp.int32)), 1)
  gid = jnp.where(real, (rank * groups) // n_real, -1)

  def group(j):
    wj = jnp.where(gid == j, w, 0.0)
    size = jnp.sum(wj)
    loss, g = objective(params, Batch(x=batch.x, y=batch.y, w=wj), key)
    return _lifted_group(agg, loss, g, size)

  return _summed(jax.vmap(group)(jnp.arange(groups)))


def _dense_per_example_wgm(model, kind: str, params: PyTree, batch: Batch, agg, zeros: str):
  """``intra_geo_component``'s per-example estimate for a chain of dense layers
  (``model.dense_chain``, e.g. ``models.mlp``) in closed form, when the client objective is
  the task loss alone.

  One forward and one backward pass of ``Σ_i ℓ_i`` give every example's input ``a_{l,i}``
  and pre-activation gradient ``δ_{l,i}`` per layer; the per-example kernel gradient is
  ``a_{l,i} ⊗ δ_{l,i}`` and the bias gradient ``δ_{l,i}``, so the geometric-mean
  statistics are matmuls (``aggregators.outer_product_geo_stats``) instead of ``B``
  materialized per-example gradients. Same result as the per-example path up to float32
  rounding of ``log|a| + log|δ|`` vs ``log|aδ|`` (tested).

  Returns ``(mean loss over the real examples, grads shaped like params)``.
  """
  chain = model.dense_chain
  layers = chain.layers(params)
  w = batch.w.astype(jnp.float32)
  keep = w > 0
  x = jnp.where(keep.reshape((-1,) + (1,) * (batch.x.ndim - 1)), batch.x,
                jnp.zeros_like(batch.x))
  taps = [jnp.zeros((x.shape[0],) + layer["bias"].shape, jnp.float32) for layer in layers]

  def total(taps):
    logits, inputs = chain.forward(params, x, taps)
    per = losses.per_example_loss(kind, logits, batch.y)
    return jnp.sum(jnp.where(keep, per, 0.0)), (per, inputs)

  deltas, (per, inputs) = jax.grad(total, has_aux=True)(taps)
  stats = chain.rebuild(params, [
      {"kernel": aggs.outer_product_geo_stats(a, d, w, zeros),
       "bias": aggs.summed_geo_stats(d, w, zeros)} for a, d in zip(inputs, deltas)])
  grads = agg.finalize((stats, jnp.sum(keep.astype(jnp.float32))))
  loss = jnp.sum(jnp.where(keep, w * per, 0.0)) / jnp.maximum(jnp.sum(w), 1e-12)
  return loss, grads
