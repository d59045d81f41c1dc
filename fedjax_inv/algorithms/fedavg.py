"""The FedAvg family: FedAvg, FedSGD, FedProx, SCAFFOLD, FedAvgM, FedAdagrad, FedAdam,
FedYogi. Each is a few lines over ``base.build``."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_inv.algorithms import penalties
from fedjax_inv.algorithms.base import (FEDSGD_CLIENT_RECIPE, FEDSGD_FIXED, build, register,
                                        uniform_mean)
from fedjax_inv.core.algorithm import Component, hparam


@register("fedavg", paper="McMahan et al. 2017, Alg. 1",
          summary="local SGD steps, server averages client models (weighted by size)")
def fedavg(**kw):
  """FedAvg: K local steps of the client optimizer; ``w_{t+1} = Σ_k n_k w_k / Σ n_k``
  with the default server optimizer ``sgd(1.0)`` (``server_lr`` ≠ 1 scales the step)."""
  return build("fedavg", **kw)


@register("fedsgd", paper="McMahan et al. 2017 (FedSGD); FedILC §5 baseline",
          summary="one full-batch gradient per client per round, server SGD step",
          fixed=FEDSGD_FIXED)
def fedsgd(server_lr: float = 0.1, batch_size=None, server_optimizer: str = "sgd", **kw):
  """FedSGD: each client sends its full-batch gradient at ``w_t`` (one local step of
  ``sgd(1.0)``, so the pseudo-gradient *is* the gradient); the server steps
  ``w ← w − η Σ_k n_k g_k / Σ n_k`` with ``η = server_lr``. ``client_lr`` and
  ``local_steps`` are fixed (1.0 and 1)."""
  for k in FEDSGD_CLIENT_RECIPE:
    if k in kw:
      raise ValueError(f"fedsgd fixes {k}; set server_lr (the step size) instead.")
  return build("fedsgd", client_lr=1.0, local_steps=1, client_optimizer="sgd",
               batch_size=batch_size, server_lr=server_lr,
               server_optimizer=server_optimizer, **kw)


def prox_component(mu: float) -> Component:
  """FedProx proximal term ``(μ/2)‖w − w_t‖²`` (Li et al. 2020, eq. 2); ``mu`` may be
  traced in a batched sweep (``traced=('mu',)``)."""
  if mu < 0:
    raise ValueError(f"mu={mu}; the FedProx coefficient must be >= 0.")
  return Component(
      name="prox",
      loss=lambda params, ctx: penalties.prox_term(params, ctx.params, hparam(ctx, "mu", mu)),
      traced=("mu",))


@register("fedprox", paper="Li et al. 2020 (FedProx), eq. 2",
          summary="FedAvg + proximal term mu/2 ||w - w_t||^2 in the client loss")
def fedprox(mu: float = 0.01, **kw):
  """FedProx: client objective ``F_k(w) + (μ/2)‖w − w_t‖²`` (squared norm)."""
  return build("fedprox", components=(prox_component(mu),), record={"mu": mu}, **kw)


def scaffold_component(local_steps: int, client_lr: float) -> Component:
  """SCAFFOLD control variates, option II (Karimireddy et al. 2020, Alg. 1), for ``K =
  local_steps`` plain SGD steps of rate ``η_l = client_lr`` (a sweep's traced rate wins).

  Client step: ``y ← y − η_l (g(y) − c_i + c)``. After K steps:
  ``c_i⁺ = c_i − c + (x − y)/(K η_l)`` (the client's new state; under ``local_epochs``
  ``K`` is the client's own step count ``ctx.local_steps``); message
  ``Δc_i = c_i⁺ − c_i``. Server stage (before the server optimizer, pseudo-gradient
  unchanged): ``c ← c + (|S|/N) · mean_{i∈S} Δc_i`` (unweighted mean); ``c`` is the
  component's server state, broadcast as ``ctx.extras['scaffold']``. Per-client ``c_i``
  persist in the pool state ``[N, ...]``.
  """
  def correct(grads, ctx):  # client stage, before the client optimizer (Alg. 1 l. 10)
    return jax.tree.map(lambda g, c, ci: g - ci + c, grads, ctx.extras["scaffold"],
                        ctx.client["scaffold"])

  def new_control(params, ctx):  # Alg. 1 l. 12, option II
    c, ci = ctx.extras["scaffold"], ctx.client["scaffold"]
    k = local_steps if ctx.local_steps is None else ctx.local_steps  # local_epochs: K_i
    step = k * hparam(ctx, "client_lr", client_lr)
    return jax.tree.map(lambda ci, c, x, y: ci - c + (x - y) / step, ci, c, ctx.params,
                        params)

  def message(params, ctx):  # Δc_i
    return jax.tree.map(jnp.subtract, new_control(params, ctx), ctx.client["scaffold"])

  def control_update(pseudo_grad, state, messages, ctx):  # Alg. 1 l. 17; state = c
    frac = ctx.cohort / ctx.num_clients
    return pseudo_grad, jax.tree.map(lambda c, d: c + frac * d, state, messages["scaffold"])

  zeros = lambda params: jax.tree.map(jnp.zeros_like, params)  # noqa: E731
  return Component(name="scaffold", client_stage=correct,
                   init_client=zeros, update_client=new_control,
                   message=message, aggregator=uniform_mean(),
                   init_server=zeros, server_stage=control_update)


@register("scaffold", paper="Karimireddy et al. 2020 (SCAFFOLD), Alg. 1 option II",
          summary="control variates correct client drift; per-client state in the pool")
def scaffold(weighting: str = "uniform", client_optimizer: str = "sgd", **kw):
  """SCAFFOLD with option-II control variates. Requires the plain-SGD client optimizer
  (the control-variate update divides by ``K η_l``; build anew, not ``.replace``, to
  change them). Server chain: control update, then ``x ← x + η_g mean Δy`` (uniform
  mean, as in the paper; pass ``weighting='num_examples'`` to weight)."""
  if client_optimizer != "sgd":
    raise ValueError(f"scaffold needs client_optimizer='sgd' (got {client_optimizer!r}): "
                     "option II control variates assume plain local SGD steps.")
  alg = build("scaffold", weighting=weighting, client_optimizer="sgd", **kw)
  return alg.with_component(scaffold_component(alg.local_steps, alg.hparams["client_lr"]))


@register("fedavgm", paper="Hsu et al. 2019; Reddi et al. 2021",
          summary="FedAvg with server momentum on the pseudo-gradient")
def fedavgm(server_lr: float = 1.0, server_momentum: float = 0.9, **kw):
  return build("fedavgm", server_optimizer="momentum", server_lr=server_lr,
               server_momentum=server_momentum, **kw)


def _adaptive(name, kind, doc):
  def factory(server_lr: float = 0.01, server_tau: float = 1e-3, b1: float = 0.9,
              b2: float = 0.99, **kw):
    return build(name, server_optimizer=kind, server_lr=server_lr, server_tau=server_tau,
                 b1=b1, b2=b2, **kw)
  factory.__doc__ = doc
  factory.__name__ = name
  return register(name, paper="Reddi et al. 2021 (Adaptive Federated Optimization), Alg. 2",
                  summary=f"FedAvg clients, server {kind} on the pseudo-gradient")(factory)


fedadagrad = _adaptive("fedadagrad", "adagrad", "FedAdagrad: server Adagrad (Reddi Alg. 2).")
fedadam = _adaptive("fedadam", "adam", "FedAdam: server Adam without bias correction.")
fedyogi = _adaptive("fedyogi", "yogi", "FedYogi: server Yogi (Reddi Alg. 2).")


@register("fednova", paper="Wang et al. 2020 (FedNova), §4, eq. 6 (vanilla local SGD)",
          summary="normalized averaging: each update divided by its client's local steps, "
                  "rescaled by their weighted mean (= FedAvg when steps are equal)")
def fednova(**kw):
  """FedNova: FedAvg whose pseudo-gradient is ``τ_eff Σ p_i Δ_i / τ_i``
  (``fedjax_inv.aggregation.robust.fednova``), correct when clients run different numbers of local
  steps (``local_epochs`` over clients of different sizes, stragglers). Raises
  ValueError for an ``aggregator`` other than 'mean' (FedNova is its own aggregator)."""
  from fedjax_inv.aggregation import robust
  if kw.get("aggregator", "mean") != "mean":
    raise ValueError(f"fednova: aggregator={kw['aggregator']!r}; FedNova's normalized "
                     "average is its aggregator, leave --aggregator unset.")
  alg = build("fednova", **kw)
  return alg.replace(aggregator=robust.fednova(alg.local_steps),
                     hparams={**alg.hparams, "aggregator": "fednova"})
