"""Ditto (Li et al. 2021, "Ditto: Fair and Robust Federated Learning Through
Personalization", Alg. 1): every client keeps a personal model ``v_k`` beside the global
one.

In each round a sampled client ``k``:
  1. trains the global model from ``w_t`` with the base algorithm's local solver (FedAvg's
     local SGD here) and sends its pseudo-gradient, exactly as FedAvg;
  2. takes ``s`` steps on its personal objective (Ditto eq. 2)
     ``h_k(v; w_t) = F_k(v) + (λ/2)‖v − w_t‖²``:
     ``v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w_t))`` on minibatches of its own data.
The server aggregates the global updates only; ``v_k`` never leaves the client. ``λ = 0``
gives purely local models, a large ``λ`` personal models that stay at the global one.

The personal models live in the engine's per-client pool state (``[N, ...]``, the
component's ``init_client`` / ``update_client`` hooks), so every execution strategy, sweep
replica and checkpoint carries them. Evaluation reports each client's personal model on
its own held-out rows (``personal_val_*``) and training data (``personal_train_*``)
beside the global model's (``fedjax_inv.runner.simulation.personal_metrics``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_inv.algorithms.base import build, register
from fedjax_inv.core import losses
from fedjax_inv.core.algorithm import Component, hparam
from fedjax_inv.core.client import batch_indices, default_forward


def ditto_component(lam: float, personal_steps: int, personal_lr: float | None,
                    client_lr: float, batch_size: int | None) -> Component:
  """Ditto's personal models as a :class:`Component` named ``'ditto'``.

  Args:
    lam: λ ≥ 0 of Ditto eq. 2, the pull of ``v_k`` towards the global ``w_t`` (a
      batched sweep may trace it: ``'ditto_lambda'``).
    personal_steps: ``s`` ≥ 1, personal SGD steps per round a client takes part in
      (Ditto Alg. 1 line 7).
    personal_lr: η of the personal steps; None = the client learning rate
      (``client_lr``, or a sweep replica's traced one).
    client_lr: the algorithm's client learning rate (η when ``personal_lr`` is None).
    batch_size: examples per personal step, drawn with replacement from the client's
      real rows (``core.client.batch_indices``, as the global local steps); None = the
      client's whole data every step.

  Returns:
    the component: ``init_client(params) = params`` (every ``v_k`` starts at the initial
    global model ``w_0``, as the official code does), ``update_client`` the ``s`` steps
    above (one client: ``batch`` its whole padded data ``[n_max, ...]`` with 0/1 weights,
    ``ctx.params`` = ``w_t``, ``ctx.client['ditto']`` = ``v_k``), ``personal_params`` the
    identity.

  Raises:
    ValueError: ``lam < 0``, ``personal_steps < 1`` or ``personal_lr <= 0``.

  Source: Ditto (Li et al. 2021) eq. 2 and Alg. 1 (lines 6-8).
  """
  if lam < 0:
    raise ValueError(f"ditto_lambda={lam}; Ditto's λ must be >= 0 (0: purely local "
                     "personal models).")
  if personal_steps < 1:
    raise ValueError(f"personal_steps={personal_steps}; use an integer >= 1.")
  if personal_lr is not None and personal_lr <= 0:
    raise ValueError(f"personal_lr={personal_lr}; it must be > 0 (or None: the client "
                     "learning rate).")

  def update(model, kind, batch, ctx, key):  # v_k is pulled to w_t (ctx.params)
    w_t, v = ctx.params, ctx.client["ditto"]
    lam_t = hparam(ctx, "ditto_lambda", lam)
    eta = personal_lr if personal_lr is not None else hparam(ctx, "client_lr", client_lr)
    k_idx, k_fwd = jax.random.split(key)
    step_keys = jax.random.split(k_fwd, personal_steps)

    def task_loss(v, x, y, w, k):
      return losses.mean_loss(kind, default_forward(model, v, x, k).logits, y, w)

    def step(v, inp):
      x, y, w, k = inp
      g = jax.grad(task_loss)(v, x, y, w, k)
      return jax.tree.map(lambda vi, gi, wi: vi - eta * (gi + lam_t * (vi - wi)),
                          v, g, w_t), None

    if batch_size is None:  # the whole client every step
      xs = (jnp.broadcast_to(batch.x, (personal_steps,) + batch.x.shape),
            jnp.broadcast_to(batch.y, (personal_steps,) + batch.y.shape),
            jnp.broadcast_to(batch.w, (personal_steps,) + batch.w.shape), step_keys)
    else:
      n = jnp.sum(batch.w).astype(jnp.int32)
      idx = batch_indices(k_idx, n, personal_steps, batch_size)
      xs = (batch.x[idx], batch.y[idx], jnp.ones(idx.shape, jnp.float32), step_keys)
    v, _ = jax.lax.scan(step, v, xs)
    return v

  return Component(name="ditto", init_client=lambda params: params, update_client=update,
                   personal_params=lambda state: state, traced=("ditto_lambda",))


@register("ditto", paper="Li et al. 2021 (Ditto), eq. 2 and Alg. 1",
          summary="FedAvg global model + a personal model per client, pulled to the "
                  "global one by lambda/2 ||v - w_t||^2; personalized accuracy reported")
def ditto(ditto_lambda: float = 0.1, personal_steps: int | None = None,
          personal_lr: float | None = None, **kw):
  """Ditto over FedAvg: the global model is trained exactly as :func:`fedavg` (same
  keywords); each client also keeps ``v_k`` (:func:`ditto_component`).

  Args:
    ditto_lambda: λ of Ditto eq. 2 (default 0.1).
    personal_steps: personal steps ``s`` per round (default: ``local_steps``).
    personal_lr: their learning rate (default: ``client_lr``, and then absent from
      ``hparams``, so a sweep over ``client_lr`` moves both and still runs batched).
    **kw: FedAvg's keywords (``client_lr``, ``local_steps``, ``batch_size``, ...).

  Raises:
    ValueError: a bad value (names it), or ``local_epochs`` (the personal solver runs a
      fixed ``s`` steps; give ``personal_steps``/``local_steps`` instead).
  """
  if kw.get("local_epochs") is not None:
    raise ValueError("ditto: local_epochs is not supported (the personal solver runs a "
                     "fixed number of steps s); use local_steps and personal_steps.")
  alg = build("ditto", **kw)
  s = alg.local_steps if personal_steps is None else int(personal_steps)
  comp = ditto_component(ditto_lambda, s, personal_lr, alg.hparams["client_lr"],
                         alg.batch_size)
  alg = alg.with_component(comp)
  hp = {**alg.hparams, "ditto_lambda": ditto_lambda, "personal_steps": s}
  if personal_lr is not None:  # absent: the personal steps follow client_lr (traced too)
    hp["personal_lr"] = personal_lr
  return alg.replace(hparams=hp)
