"""FedSR (Nguyen, Torr & Lim 2022): FedAvg whose clients train a probabilistic
representation with the L2R and CMI terms (eq. 9-11, 17-18); registered ``fedsr``,
``fedl2r``, ``fedcmi``. The model head is ``fedsr_model.py``; where ``r(z|y)`` lives
(``r_mode``), the message protocol, defaults and the official code's differences:
docs/ALGORITHMS.md#fedsr.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_inv.algorithms import penalties
from fedjax_inv.algorithms.base import build, register
from fedjax_inv.algorithms.fedsr_model import (REFERENCE, fedsr_model, gaussian_params,
                                               mc_predict_logits)
from fedjax_inv.core import losses
from fedjax_inv.core.validation import choice as _choice, flag as _flag, nonneg as _nonneg
from fedjax_inv.core.validation import pos_int as _pos_int, positive as _positive
from fedjax_inv.core.algorithm import Component, Forward, learning_rate_in_round

NAME = "fedsr"
R_MODES = ("local", "averaged")


def fedsr_component(alpha_l2r: float = 1e-2, alpha_cmi: float = 5e-4,
                    mc_samples: int = 20, l2r_squared: bool = True,
                    r_mode: str = "local", probabilistic: bool = True,
                    sigma_min: float = 1e-5, weight_decay: float = 0.0,
                    client_optimizer: str = "sgd") -> Component:
  """FedSR's client-side ``Component`` (name ``'fedsr'``).

  Hooks:
    forward (probabilistic only): ``(μ, σ) = gaussian_params(x)``, ``z = μ + σ ⊙ ε``,
      ``ε ~ N(0, I)`` (reparameterization trick, FedSR §3.3.3), returns
      ``Forward(z [B, z_dim], logits [B, K], aux=(μ, σ))``.
    eval_forward (probabilistic only): ``mc_samples`` draws of ``z``,
      :func:`mc_predict_logits` of their logits, ``[B, K]``.
    loss: ``alpha_l2r · mean_i ‖z_i‖²`` (``‖z_i‖`` if not ``l2r_squared``; FedSR eq.
      10-11) ``+ alpha_cmi · mean_i KL(N(μ_i, σ_i²) ‖ N(r_μ[y_i], r_σ[y_i]²))`` (FedSR
      eq. 17-18, analytic Gaussian KL summed over ``z_dim``); means are weighted by the
      batch's example weights (padding excluded).
    init_client / update_client / server_stage / client_stage (``r_mode='local'``
    with CMI):
      per-client ``r`` (see the module docstring).

  Raises:
    ValueError: negative or non-finite coefficients or ``sigma_min <= 0``;
      ``mc_samples`` not a positive int; ``r_mode`` not in ('local', 'averaged');
      ``alpha_cmi > 0`` with ``probabilistic=False`` (the KL needs ``p(z|x)``).
      At trace time: the CMI term or the probabilistic head on a 'regression' task.

  Source: FedSR §3.3 eq. 9-11, 17-18; official code (``methods/FedSR.py``).
  """
  alpha_l2r = _nonneg("alpha_l2r", alpha_l2r)
  alpha_cmi = _nonneg("alpha_cmi", alpha_cmi)
  weight_decay = _nonneg("weight_decay", weight_decay)
  _pos_int("mc_samples", mc_samples)
  sigma_min = _positive("sigma_min", sigma_min)
  _choice("r_mode", r_mode, R_MODES)
  _flag("l2r_squared", l2r_squared, " (True: the paper's ‖z‖², False: the official ‖z‖)")
  _flag("probabilistic", probabilistic)
  use_cmi = alpha_cmi > 0
  if use_cmi and not probabilistic:
    raise ValueError(f"alpha_cmi={alpha_cmi} needs probabilistic=True: the CMI term is a "
                     "KL divergence of p(z|x) (FedSR §3.3.2).")
  local = use_cmi and r_mode == "local"

  def forward(model, params, batch, key):
    mu, sigma = gaussian_params(model, params, batch.x, sigma_min)
    z = mu + sigma * jax.random.normal(key, mu.shape, mu.dtype)
    return Forward(z=z, logits=model.classify(params, z), aux=(mu, sigma))

  def eval_forward(model, params, batch, key):
    mu, sigma = gaussian_params(model, params, batch.x, sigma_min)
    eps = jax.random.normal(key, (mc_samples,) + mu.shape, mu.dtype)
    return mc_predict_logits(model.classify(params, mu + sigma * eps))

  def reference(params, ctx):
    raw = params[REFERENCE]
    if local:
      raw = jax.tree.map(lambda p, r, g: r + (p - g), raw, ctx.client[NAME],
                         ctx.params[REFERENCE])
    return raw["mu"], jax.nn.softplus(raw["sigma_raw"]) + sigma_min

  def loss(kind, params, batch, ctx, fwd):
    if kind == "regression" and probabilistic:
      raise ValueError("FedSR's probabilistic head and CMI term need a classification "
                       "task ('binary' or 'multiclass'); use fedl2r with "
                       "probabilistic=False for regression.")
    total = jnp.zeros((), jnp.float32)
    if alpha_l2r > 0:
      total = total + alpha_l2r * penalties.l2r(fwd.z, batch.w, squared=l2r_squared)
    if use_cmi:
      mu, sigma = fwd.aux
      r_mu, r_sigma = reference(params, ctx)
      y = batch.y.reshape(batch.y.shape[0]).astype(jnp.int32)
      keep = batch.w > 0  # padded rows reach neither the KL's value nor its gradient
      kl = penalties.gaussian_kl(losses.mask_rows(mu, keep), losses.mask_rows(sigma, keep, 1),
                                 r_mu[y], r_sigma[y])
      total = total + alpha_cmi * losses.weighted_mean(kl, batch.w)
    return total

  hooks = dict(loss=loss)
  if probabilistic:
    hooks.update(forward=forward, eval_forward=eval_forward)
  if local:
    def init_client(params):
      return jax.tree.map(jnp.array, params[REFERENCE])

    def update_client(params, ctx):  # the client's own r
      return jax.tree.map(lambda r, p, p0: r + (p - p0), ctx.client[NAME],
                          params[REFERENCE], ctx.params[REFERENCE])

    # The server keeps the global reference: its pseudo-gradient is zeroed (a stage
    # needing no messages: an ordinary optax transformation).
    keep_reference = optax.masked(optax.set_to_zero(), _reference_mask)
    hooks.update(init_client=init_client, update_client=update_client,
                 server_stage=keep_reference)
    if weight_decay > 0 and client_optimizer in ("sgd", "momentum"):
      # Coupled decay adds wd·θ_ref; the client's r is θ_ref + (r_k − θ_ref,t), so add
      # the constant wd·(r_k − θ_ref,t) to decay r_k itself.
      def decay_fix(grads, ctx):  # client stage, before the client optimizer's decay
        fix = jax.tree.map(lambda g, r, p0: g + weight_decay * (r - p0),
                           grads[REFERENCE], ctx.client[NAME], ctx.params[REFERENCE])
        return {**grads, REFERENCE: fix}

      hooks.update(client_stage=decay_fix)
  return Component(name=NAME, needs_split=True, **hooks)


def _reference_mask(params):
  """Mask of the reference ``r(z|y)`` subtree of ``params`` (True there)."""
  return {k: jax.tree.map(lambda _: k == REFERENCE, v) for k, v in params.items()}


def _decay_mask(params):
  """AdamW decay mask: every parameter except the reference ``r(z|y)``."""
  return {k: jax.tree.map(lambda _: k != REFERENCE, v) for k, v in params.items()}


def _reject_fixed(name, kw, fixed):
  """ValueError for hyperparameters a variant fixes (instead of a duplicate-kwarg error)."""
  bad = sorted(set(kw) & set(fixed))
  if bad:
    raise ValueError(f"{name} fixes {', '.join(f'{k}={fixed[k]!r}' for k in bad)}; use "
                     "'fedsr' to set them.")


def _build(name, *, alpha_l2r, alpha_cmi, z_dim, mc_samples, l2r_squared, r_mode,
           probabilistic, sigma_min, local_steps, batch_size, weighting, **kw):
  if z_dim is not None:
    _pos_int("z_dim", z_dim)
  comp = fedsr_component(alpha_l2r=alpha_l2r, alpha_cmi=alpha_cmi, mc_samples=mc_samples,
                         l2r_squared=l2r_squared, r_mode=r_mode,
                         probabilistic=probabilistic, sigma_min=sigma_min,
                         weight_decay=kw.get("weight_decay", 0.0),
                         client_optimizer=kw.get("client_optimizer", "sgd"))
  with_ref = float(alpha_cmi) > 0
  alg = build(name, components=(comp,), local_steps=local_steps, batch_size=batch_size,
              weighting=weighting, **kw)
  hp = dict(alg.hparams, alpha_l2r=float(alpha_l2r), alpha_cmi=float(alpha_cmi),
            z_dim=None if z_dim is None else int(z_dim), probabilistic=probabilistic,
            l2r_squared=l2r_squared,
            sigma_min=float(sigma_min))
  if probabilistic:
    hp["mc_samples"] = int(mc_samples)
  if with_ref:
    hp["r_mode"] = r_mode
  if with_ref and r_mode == "local" and alg.hparams["client_optimizer"] == "adam" \
      and alg.hparams["weight_decay"] > 0:
    # AdamW's decoupled decay would act on the offset; keep r_k out of it (module doc).
    wd = alg.hparams["weight_decay"]
    alg = alg.replace(client_optimizer=learning_rate_in_round(
        "client_lr", lambda lr: optax.adamw(lr, weight_decay=wd, mask=_decay_mask),
        alg.hparams["client_lr"]))
    hp["reference_weight_decay"] = False
  transform = lambda m: fedsr_model(m, z_dim, probabilistic, with_ref)  # noqa: E731
  return alg.replace(model_transform=transform, hparams=hp)


@register("fedsr", paper="FedSR (Nguyen et al. 2022), §3.3 eq. 9-11, 17-18",
          summary="probabilistic representation z~N(mu,sigma) + L2R + CMI (r(z|y) "
                  "local per client by default)")
def fedsr(alpha_l2r: float = 1e-2, alpha_cmi: float = 5e-4, z_dim: int | None = None,
          mc_samples: int = 20, l2r_squared: bool = True, r_mode: str = "local",
          sigma_min: float = 1e-5, local_steps: int = 5, batch_size: int | None = 64,
          weighting: str = "uniform", client_optimizer_state: str = "persistent", **kw):
  """FedSR: FedAvg with client objective ``CE + α_L2R ℓ^L2R + α_CMI ℓ^CMI`` (FedSR eq. 9)
  on a probabilistic representation ``z ~ N(μ(x), σ(x)²)``.

  Args:
    alpha_l2r, alpha_cmi: ``>= 0`` (official defaults 1e-2, 5e-4).
    z_dim: representation size; None = the task model's own (FedSR §4.2, §5: 64 on
      RotatedMNIST, 512 ResNet-18, 2048 ResNet-50); see ``fedsr_model``.
    mc_samples: Monte-Carlo draws averaged at evaluation (official default 20).
    l2r_squared: ``‖z‖²`` (paper eq. 10-11, default) or ``‖z‖`` (official code).
    r_mode: ``'local'`` (per-client ``r(z|y)``, official code) or ``'averaged'``.
    sigma_min: floor added to every softplus standard deviation.
    local_steps, batch_size: FedSR §4.2 (E = 5, minibatch 64).
    weighting: ``'uniform'`` (FedSR eq. 1, official ``communicate``) | ``'num_examples'``.
    client_optimizer_state: ``'persistent'`` (default: each client's optimizer state,
      e.g. its SGD momentum buffers, is created once and carried across the rounds it
      takes part in, in the engine's per-client pool ``[N, ...]``; the official code
      creates every client's optimizer once) | ``'restart'`` (a fresh state every round,
      FedAvg's ClientUpdate). See ``Algorithm.client_optimizer_state``.
    **kw: the common knobs of ``base.build`` (client_lr, server_lr, ...).

  Raises:
    ValueError: see :func:`fedsr_component`; ``z_dim`` not a positive int; unknown
      keyword; ``client_optimizer_state`` not 'restart' / 'persistent'.
  """
  _reject_fixed("fedsr", kw, dict(probabilistic=True))
  return _build("fedsr", alpha_l2r=alpha_l2r, alpha_cmi=alpha_cmi, z_dim=z_dim,
                mc_samples=mc_samples, l2r_squared=l2r_squared, r_mode=r_mode,
                probabilistic=True, sigma_min=sigma_min, local_steps=local_steps,
                batch_size=batch_size, weighting=weighting,
                client_optimizer_state=client_optimizer_state, **kw)


@register("fedl2r", paper="FedSR (Nguyen et al. 2022), §3.3.1 eq. 10-11 (FedL2R)",
          summary="FedAvg + L2 norm of the representation (deterministic z by default)")
def fedl2r(alpha_l2r: float = 1e-2, z_dim: int | None = None, probabilistic: bool = False,
           mc_samples: int = 20, l2r_squared: bool = True, sigma_min: float = 1e-5,
           local_steps: int = 5, batch_size: int | None = 64, weighting: str = "uniform",
           client_optimizer_state: str = "persistent", **kw):
  """FedL2R: FedSR's L2R term only (FedSR eq. 10-11). Deterministic representation
  ``z = Linear(featurizer(x))`` by default (FedSR §3.3.2 uses a probabilistic network
  only with the CMI term; official ``FedL2R.py``); ``probabilistic=True`` samples ``z``
  as in ``fedsr``. Arguments as in :func:`fedsr`.

  Raises:
    ValueError: see :func:`fedsr`.
  """
  _reject_fixed("fedl2r", kw, dict(alpha_cmi=0.0, r_mode=None))
  return _build("fedl2r", alpha_l2r=alpha_l2r, alpha_cmi=0.0, z_dim=z_dim,
                mc_samples=mc_samples, l2r_squared=l2r_squared, r_mode="local",
                probabilistic=probabilistic, sigma_min=sigma_min,
                local_steps=local_steps, batch_size=batch_size, weighting=weighting,
                client_optimizer_state=client_optimizer_state, **kw)


@register("fedcmi", paper="FedSR (Nguyen et al. 2022), §3.3.2 eq. 17-18 (FedCMI)",
          summary="probabilistic representation + CMI term KL(p(z|x) || r(z|y))")
def fedcmi(alpha_cmi: float = 5e-4, z_dim: int | None = None, mc_samples: int = 20,
           r_mode: str = "local", sigma_min: float = 1e-5, local_steps: int = 5,
           batch_size: int | None = 64, weighting: str = "uniform",
           client_optimizer_state: str = "persistent", **kw):
  """FedCMI: FedSR's CMI term only (FedSR eq. 17-18) on the probabilistic
  representation. Arguments as in :func:`fedsr`.

  Raises:
    ValueError: see :func:`fedsr`.
  """
  _reject_fixed("fedcmi", kw, dict(alpha_l2r=0.0, l2r_squared=None, probabilistic=True))
  return _build("fedcmi", alpha_l2r=0.0, alpha_cmi=alpha_cmi, z_dim=z_dim,
                mc_samples=mc_samples, l2r_squared=True, r_mode=r_mode,
                probabilistic=True, sigma_min=sigma_min, local_steps=local_steps,
                batch_size=batch_size, weighting=weighting,
                client_optimizer_state=client_optimizer_state, **kw)
