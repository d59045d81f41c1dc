"""The Fishr penalty of FedILC §3.2 as a message protocol (pre-stage gradient variances,
main-stage VJP, server step ``+ λ ∇L_Fishr``). Factories:
``fedjax_inv/algorithms/fedilc.py``; the array math: ``fedjax_inv/algorithms/penalties.py``.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_inv.algorithms import penalties
from fedjax_inv.algorithms.base import uniform_mean
from fedjax_inv.core.algorithm import Batch, Component, hparam
from fedjax_inv.core.validation import choice as _choice, nonneg as _nonneg

PyTree = Any


# ---------------------------------------------------------------------------------------
# Fishr (FedILC §3.2): pre-stage v_e → v̄, main-stage VJP, server adds λ·mean VJP
# ---------------------------------------------------------------------------------------


def client_grad_variance(model, kind: str, params: PyTree, batch: Batch) -> dict:
  """``v_e = C_e``: per-coordinate variance over the client's examples of the per-example
  gradients of the final linear classifier, at ``params``.

  Args:
    model: ``FunctionalModel`` (featurizer → ``z [n_max, d]``, linear classifier).
    kind: 'binary' | 'multiclass' (Fishr needs a likelihood over classes).
    params: model parameters (differentiable: featurizer and classifier).
    batch: the client's data, ``Batch(x [n_max, ...], y [n_max], w [n_max])`` (``w``
      1.0 real, 0.0 padding).

  Returns:
    ``{'kernel': [d, K], 'bias': [K]}`` (``K = 1`` for binary): the biased (``1/n_e``)
    variance over the real examples; padded rows have weight 0.

  Raises:
    ValueError: ``kind == 'regression'`` (raised while tracing the round).

  Source: FedILC §3.2 (C_e) with §5's diagonal, classifier-only simplification;
  ``penalties.per_sample_classifier_grad_variance``.
  """
  if kind not in ("binary", "multiclass"):
    raise ValueError(f"Fishr (FedILC §3.2) needs a classification task; got loss kind "
                     f"{kind!r}. Use 'geometric' or 'fedcurv' for regression.")
  z = model.features(params, batch.x)
  logits = model.classify(params, z)
  return penalties.per_sample_classifier_grad_variance(z, logits, batch.y, batch.w)


FISHR_REDUCTIONS = ("sum", "mean")


def fishr_component(fishr_lambda: float, reduction: str = "sum") -> Component:
  """The Fishr penalty ``λ∇L_Fishr`` as a message protocol over the engine's hooks.

  Scale of ``L_Fishr`` (``reduction``; ``E`` = clients sampled this round):

  * ``'sum'`` (default): ``L_Fishr = Σ_e ‖C_e − C̄‖²``, as FedILC's official code computes
    it (``fishr_loss += l2_between_dicts(...)`` over the clients, no division by ``E``).
    The published λ values (15 / 1.0 / 0.1) were tuned with this scale, so with
    ``'sum'`` they mean what the paper's experiments ran.
  * ``'mean'``: ``L_Fishr = (1/E) Σ_e ‖C_e − C̄‖²``, Alg. 1-2 of the paper literally; the
    same λ then acts ``E`` times weaker (pass ``E·λ`` to reproduce the published runs).

  Server state ``{'mean_var': v̄ (classifier-shaped: {'kernel': [d, K], 'bias': [K]}),
  'penalty': L_Fishr}``, refreshed every round by the pre-stage.

  * ``pre_message`` (client ``e``, at ``w_t``): ``{'v': v_e, 'sq': ‖v_e‖²}`` with
    ``v_e = client_grad_variance(...)``; aggregated by the uniform mean;
  * ``pre_update``: stores ``v̄`` and ``L_Fishr = mean_e ‖v_e‖² − ‖v̄‖²``
    ``= (1/E) Σ_e ‖v_e − v̄‖²`` (the penalty's value, for inspection; may round to a tiny
    negative number);
  * ``message`` (client ``e``, at ``w_t``, whatever its local training did):
    ``2(v_e − v̄)ᵀ ∂v_e/∂θ`` via ``jax.vjp`` — a pytree shaped like the parameters;
    aggregated by the uniform mean;
  * ``server_stage`` (before the server optimizer): ``pseudo_grad + λ · mean_e VJP_e``
    (``= λ∇L_Fishr``).

  ``E`` is the cohort sampled this round (all clients when ``clients_per_round`` is the
  pool size, as in FedILC).

  With ``'sum'`` the stored ``penalty`` and the server's term are ``E`` times the mean
  forms below (the server multiplies the mean VJP by ``ctx.cohort = E``).

  Args:
    fishr_lambda: ``λ >= 0`` (FedILC §5.1: 15.0 Color-MNIST, 1.0 Rotated-CIFAR10, 0.1
      eICU, on the ``'sum'`` scale). With ``λ = 0`` the pseudo-gradient is returned
      unchanged (bit for bit).
    reduction: ``'sum'`` (official code, default) or ``'mean'`` (Alg. 1-2 literally).

  Raises:
    ValueError: ``fishr_lambda`` negative or not finite; unknown ``reduction``.

  Source: FedILC §3.2 (L_Fishr, eq. for w_{t+1}), Alg. 1-2; docs/ARCHITECTURE.md, 'A
  round is a map-reduce over a client axis'.
  """
  lam = _nonneg("fishr_lambda", fishr_lambda)
  _choice("fishr_reduction", reduction, FISHR_REDUCTIONS)
  summed = reduction == "sum"

  def init_server(params):
    cls = params["classifier"]
    return {"mean_var": {"kernel": jnp.zeros_like(cls["kernel"]),
                         "bias": jnp.zeros_like(cls["bias"])},
            "penalty": jnp.zeros((), jnp.float32)}

  def pre_message(model, kind, params, batch):
    v = client_grad_variance(model, kind, params, batch)
    sq = sum(jnp.sum(a * a) for a in jax.tree.leaves(v))
    return {"v": v, "sq": sq}

  def pre_update(aggregate, ctx):  # the clients' mean variance and squared norm
    v_bar = aggregate["v"]
    sq_bar = sum(jnp.sum(a * a) for a in jax.tree.leaves(v_bar))
    pen = aggregate["sq"] - sq_bar
    if summed:
      pen = pen * ctx.cohort
    return {"mean_var": v_bar, "penalty": pen.astype(jnp.float32)}

  def message(model, kind, batch, ctx):  # at w_t = ctx.params
    v_bar = ctx.extras["fishr"]["mean_var"]
    v, vjp_fn = jax.vjp(lambda p: client_grad_variance(model, kind, p, batch), ctx.params)
    cot = jax.tree.map(lambda a, b: 2.0 * (a - b), v, v_bar)
    (g,) = vjp_fn(cot)
    return g

  def server_gradient(pseudo_grad, state, messages, ctx):  # server stage
    lam_t = hparam(ctx, "fishr_lambda", None)  # a batched sweep replica's traced λ
    if lam_t is None:
      if lam == 0.0:  # exactly the pseudo-gradient (even if a VJP were not finite)
        return pseudo_grad, state
      lam_t = lam
    scale = lam_t * ctx.cohort if summed else lam_t
    return jax.tree.map(lambda p, g: p + scale * g, pseudo_grad, messages["fishr"]), state

  return Component(name="fishr", init_server=init_server, pre_message=pre_message,
                   pre_aggregator=uniform_mean(), pre_update=pre_update, message=message,
                   aggregator=uniform_mean(), server_stage=server_gradient,
                   traced=("fishr_lambda",), needs_split=True)
