"""What one client computes in a round: its local training (:func:`local_train`, one
step's gradient :func:`step_gradient` of the objective :func:`make_objective`), what it
sees (:func:`client_context`) and its components' work after training
(:func:`client_outputs`). Shared by the engine (``core/engine.py``) and the memory
estimate (``core/memory.py``), which traces these same functions."""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_inv.core import losses
from fedjax_inv.core import strategy as strategy_lib
from fedjax_inv.core.algorithm import Algorithm, Batch, Context, Forward, Objective


def batch_indices(key, n, local_steps: int, batch_size: int) -> jax.Array:
  """``[local_steps, batch_size]`` int32 example indices, uniform over ``[0, n)`` with
  replacement, drawn once per client per round (one key, one call)."""
  return jax.random.randint(key, (local_steps, batch_size), 0, n)


def full_batch(x, y, n) -> Batch:
  """The client's whole padded data as one batch; padding gets weight 0."""
  w = (jnp.arange(x.shape[0]) < n).astype(jnp.float32)
  return Batch(x=x, y=y, w=w)


def default_forward(model, params, x, key=None) -> Forward:
  """The model's forward pass in training: a model with dropout (``model.stochastic``,
  e.g. ``models.federated.femnist_cnn``) gets the step's ``key``; every other model is
  deterministic and ignores it."""
  if key is not None and getattr(model, "stochastic", False):
    z = model.features(params, x, key)
  else:
    z = model.features(params, x)
  return Forward(z=z, logits=model.classify(params, z))


def eval_logits_fn(model, algorithm: Algorithm | None = None) -> Callable:
  """``logits(params, x [B, ...], key) -> [B, K]`` used for evaluation: a component's
  ``eval_forward`` (FedSR's Monte-Carlo prediction) if one defines it, else its
  ``forward``'s logits, else the deterministic ``model.apply``. Shared by
  ``eval.build_evaluator`` and ``eval.metrics.build_predict``."""
  comp = None
  if algorithm is not None:
    comp = next((c for c in algorithm.components
                 if c.eval_forward is not None or c.forward is not None), None)

  def logits(params, x, key):
    if comp is None:
      return model.apply(params, x)
    inputs = Batch(x=x, y=None, w=None)  # evaluation's forward pass sees the inputs only
    if comp.eval_forward is not None:
      return comp.call("eval_forward", model=model, params=params, batch=inputs, key=key)
    return comp.call("forward", model=model, params=params, batch=inputs, key=key).logits

  return logits


def make_objective(model, kind: str, algorithm: Algorithm) -> Callable:
  """``objective(params, batch, ctx, key) -> scalar`` client loss: task loss on the
  minibatch + every component's loss term, divided by the components' loss scales."""
  fwd_comp = next((c for c in algorithm.components if c.forward is not None), None)
  terms = [c for c in algorithm.components if c.loss is not None]
  scales = [c for c in algorithm.components if c.loss_scale is not None]

  def objective(params, batch: Batch, ctx: Context, key):
    keys = jax.random.split(key, len(terms) + 1)
    if fwd_comp is not None:
      fwd = fwd_comp.call("forward", model=model, params=params, batch=batch, key=keys[0])
    else:
      fwd = default_forward(model, params, batch.x, keys[0])
    loss = losses.mean_loss(kind, fwd.logits, batch.y, batch.w)
    for c, k in zip(terms, keys[1:]):
      loss = loss + c.call("loss", model=model, kind=kind, params=params, batch=batch,
                           ctx=ctx, key=k, fwd=fwd)
    for c in scales:
      loss = loss / c.call("loss_scale", ctx=ctx)
    return loss

  return objective


def step_gradient(model, kind: str, algorithm: Algorithm, ctx: Context) -> Callable:
  """``gradient(params, batch, key) -> (loss, grads)``: one local step's gradient as a
  client in ``ctx`` computes it: ``jax.value_and_grad`` of :func:`make_objective`, or the
  component's ``grad_estimator`` given that objective as an :class:`Objective`. The local
  training loop and the memory estimate (``core/memory.py``) both use it."""
  objective = make_objective(model, kind, algorithm)
  est = next((c for c in algorithm.components if c.grad_estimator is not None), None)

  def value_and_grad(params, batch, k):
    return jax.value_and_grad(objective)(params, batch, ctx, k)
  if est is None:
    return value_and_grad
  # What a gradient estimator sees: the default estimate and the task's structure.
  described = Objective(value_and_grad, model, kind, algorithm.task_only)
  return lambda params, batch, k: est.call(
      "grad_estimator", model=model, kind=kind, params=params, batch=batch, ctx=ctx, key=k,
      objective=described)


def client_steps(algorithm: Algorithm, n) -> jax.Array | None:
  """``E * ceil(n / B)`` int32: the local steps a client of ``n`` real examples runs under
  ``Algorithm.local_epochs`` (None when every client runs ``local_steps``). Works on a
  scalar ``n`` or on ``[C]`` sizes."""
  if algorithm.local_epochs is None:
    return None
  b = algorithm.batch_size
  n = jnp.asarray(n, jnp.int32)
  return jnp.int32(algorithm.local_epochs) * ((n + b - 1) // b)


def max_client_steps(algorithm: Algorithm, n_max: int) -> int:
  """The static bound on a client's local steps for data padded to ``n_max`` examples:
  ``local_steps``, or ``E * ceil(n_max / B)`` under ``local_epochs``."""
  if algorithm.local_epochs is None:
    return algorithm.local_steps
  return algorithm.local_epochs * (-(-int(n_max) // algorithm.batch_size))


def mean_step_loss(step_losses, algorithm: Algorithm, n, steps=None) -> jax.Array:
  """The mean of a client's per-step losses over the steps it ran (``[K]`` from
  :func:`local_train`; under ``local_epochs`` or a straggler's ``steps`` the entries
  past its own steps are 0)."""
  if steps is None:
    steps = client_steps(algorithm, n)
  if steps is None:
    return jnp.mean(step_losses)
  return jnp.sum(step_losses) / jnp.maximum(steps, 1).astype(step_losses.dtype)


def epoch_orders(key, n, n_max: int, epochs: int, batch_size: int) -> jax.Array:
  """``[epochs, ceil(n_max / B) * B]`` int32: for each epoch a uniform permutation of the
  client's real example indices ``[0, n)`` first, then the padding rows (which a batch
  past ``n`` reads with weight 0). One key per client per round."""
  width = -(-n_max // batch_size) * batch_size

  def one(k):
    u = jax.random.uniform(k, (n_max,))
    order = jnp.argsort(jnp.where(jnp.arange(n_max) < n, u, 2.0)).astype(jnp.int32)
    return jnp.pad(order, (0, width - n_max))
  return jax.vmap(one)(jax.random.split(key, epochs))


def _epoch_train(step, algorithm: Algorithm, x, y, n, key, loss_keys, init, cap=None):
  """``local_epochs`` training: ``lax.while_loop`` over this client's own
  ``E * ceil(n / B)`` steps (so a client scanned alone costs its real steps; under
  ``vmap`` the loop runs to the cohort's largest count and masks the rest). Step ``s``
  is batch ``s mod ceil(n/B)`` of epoch ``s // ceil(n/B)``'s permutation."""
  B, E = algorithm.batch_size, algorithm.local_epochs
  orders = epoch_orders(key, n, x.shape[0], E, B)
  per_epoch = jnp.maximum((n + B - 1) // B, 1)
  steps = E * per_epoch if cap is None else jnp.minimum(E * per_epoch, cap)
  K = loss_keys.shape[0]

  def body(state):
    s, carry, losses = state
    pos = (s % per_epoch) * B + jnp.arange(B)
    idx = jax.lax.dynamic_index_in_dim(orders, s // per_epoch, keepdims=False)[pos]
    w = (pos < n).astype(jnp.float32)
    carry, loss = step(carry, (Batch(x=x[idx], y=y[idx], w=w), loss_keys[s]))
    return s + 1, carry, losses.at[s].set(loss)

  _, carry, losses = jax.lax.while_loop(
      lambda state: state[0] < steps, body, (jnp.int32(0), init, jnp.zeros((K,), jnp.float32)))
  return carry, losses


def local_train(model, kind: str, algorithm: Algorithm, ctx: Context, x, y, n, key,
                opt_state=None, steps=None):
  """Runs ``local_steps`` client optimizer steps from ``ctx.params`` under ``lax.scan``.

  ``x: [n_max, ...]``, ``y: [n_max]``, ``n``: true size. Minibatches: ``batch_size``
  indices per step drawn with replacement from ``[0, n)`` by :func:`batch_indices` (all
  steps at once), or the full client data when ``batch_size`` is None.
  ``opt_state``: the client chain's (``algorithm.client_chain()``) state to start from,
  one client's (no pool axis; ``client_optimizer_state='persistent'``), or None for a
  fresh ``init(ctx.params)``.
  Under ``Algorithm.local_epochs`` the client runs its own ``E * ceil(n / B)`` steps
  (:func:`client_steps`) over per-epoch permutations (:func:`epoch_orders`); ``[K]`` is
  then the bound :func:`max_client_steps` and the losses past its steps are 0.
  ``steps`` (an int32 scalar, a straggler's count; ``core.adversary``): run only the
  first ``steps`` steps (the rest are skipped, their losses 0).
  Returns ``(final params, [K] per-step losses, final client-chain state)``. Source:
  FedAvg (McMahan et al. 2017) ClientUpdate, with the components' gradient estimator /
  correction hooks.
  """
  gradient = step_gradient(model, kind, algorithm, ctx)
  opt = algorithm.client_chain()  # components' client stages, then the client optimizer
  K, B = max_client_steps(algorithm, x.shape[0]), algorithm.batch_size
  k_batch, k_loss = jax.random.split(key)
  loss_keys = jax.random.split(k_loss, K)

  def step(carry, inp):
    params, opt_state = carry
    batch, kl = inp
    loss, grads = gradient(params, batch, kl)
    updates, opt_state = opt.update(grads, opt_state, params, ctx=ctx)
    return (optax.apply_updates(params, updates), opt_state), loss

  if algorithm.local_epochs is not None:
    if opt_state is None:
      opt_state = opt.init(ctx.params)
    (params, opt_state), step_losses = _epoch_train(step, algorithm, x, y, n, k_batch,
                                                    loss_keys, (ctx.params, opt_state),
                                                    steps)
    return params, step_losses, opt_state
  if B is None:
    fb = full_batch(x, y, n)
    inner = lambda carry, kl: step(carry, (fb, kl))  # noqa: E731
    xs = loss_keys
  else:
    idx = batch_indices(k_batch, n, K, B)
    if strategy_lib.pregathered(K, B, x.dtype.itemsize * math.prod(x.shape[1:])):
      ones = jnp.ones((K, B), jnp.float32)
      xs = (Batch(x=x[idx], y=y[idx], w=ones), loss_keys)
      inner = step
    else:
      def inner(carry, inp):
        i, kl = inp
        return step(carry, (Batch(x=x[i], y=y[i], w=jnp.ones((B,), jnp.float32)), kl))
      xs = (idx, loss_keys)
  if opt_state is None:
    opt_state = opt.init(ctx.params)
  if steps is not None:  # a straggler: the steps past its count are skipped
    return _capped_scan(inner, (ctx.params, opt_state), xs, steps, K)
  (params, opt_state), step_losses = jax.lax.scan(inner, (ctx.params, opt_state), xs,
                                                  unroll=strategy_lib.local_unroll(K))
  return params, step_losses, opt_state


def _capped_scan(inner, init, xs, steps, K: int):
  """``lax.scan`` of ``inner`` over ``K`` steps that runs only the first ``steps`` (a
  ``lax.cond``: a scanned client skips the rest, a batched one masks them)."""
  def body(carry, inp):
    c, s = carry
    c, loss = jax.lax.cond(s < steps, lambda cc: inner(cc, inp),
                           lambda cc: (cc, jnp.zeros((), jnp.float32)), c)
    return (c, s + 1), loss
  ((params, opt_state), _), losses = jax.lax.scan(body, (init, jnp.int32(0)), xs,
                                                  unroll=strategy_lib.local_unroll(K))
  return params, losses, opt_state


def client_context(server_params, round_, extras: dict, client: dict, num_clients,
                   cohort, local_steps=None) -> Context:
  """What a client is handed in a round (the server's broadcast plus its own state): the
  global ``server_params``, the round index, every component's server state ``extras``,
  the client's ``client`` state (``{}`` on the server side) and, under
  ``local_epochs``, its own step count ``local_steps`` (:func:`client_steps`)."""
  return Context(params=server_params, round=round_, extras=extras, client=client,
                 num_clients=jnp.float32(num_clients), cohort=jnp.float32(cohort),
                 local_steps=local_steps)


def client_outputs(model, kind: str, component, params, batch: Batch, ctx: Context, key):
  """One component's work on one client after its local training: ``(message or None,
  new client state or None)`` from its ``message`` and ``update_client`` hooks
  (``params`` the trained local model, ``batch`` the client's whole data)."""
  view = dict(model=model, kind=kind, params=params, batch=batch, ctx=ctx, key=key)
  msg = None if component.message is None else component.call("message", **view)
  new = None if component.update_client is None else component.call("update_client", **view)
  return msg, new
