"""FedSR (Nguyen, Torr & Lim 2022): simple probabilistic representations for federated DG.

Registered algorithms (all FedAvg-based, FedSR §3.3.3):
  * ``fedsr``  — probabilistic representation + L2R + CMI (FedSR eq. 9);
  * ``fedl2r`` — L2R only, deterministic representation by default (FedSR §3.3.2:
    "a deterministic network otherwise"; official ``FedL2R.py``);
  * ``fedcmi`` — probabilistic representation + CMI only.

The model. ``fedsr_model`` (the ``Algorithm.model_transform``) rebuilds the task's model
with FedSR's head: when the task's featurizer ends in a representation layer
``.projection`` (ResNet-18/50: pooled trunk → 512/2048; FedSR's RotatedMNIST ConvNet:
conv features → 64), that layer is *replaced* by ``nnx.Linear(d_in, 2·z_dim)`` producing
``(μ, pre-σ)``, exactly as the official code replaces ``net.fc``; otherwise (MLP, CNN)
``nnx.Linear(d, 2·z_dim)`` is appended. ``σ = softplus(pre-σ) + sigma_min`` (FedSR §3.2,
``p(z|x) = N(μ(x), σ(x)²)``); ``z_dim`` defaults to the model's own representation size;
the new classifier is ``nnx.Linear(z_dim, K)`` (FedSR §4.2:
"a single linear layer"). With the CMI term the model also holds the reference
distribution ``r(z|y) = N(r_μ[y], r_σ[y]²)`` as the top-level parameter ``'reference'``
(``{'mu': [C, z_dim], 'sigma_raw': [C, z_dim]}``, ``r_σ = softplus(sigma_raw) + sigma_min``,
``C = max(K, 2)`` classes; initialised ``mu = 0``, ``sigma_raw = 1`` as in the official code).

Where ``r(z|y)`` lives (``r_mode``):
  * ``'local'`` (default; FedSR's official code keeps ``r_mu``, ``r_sigma`` outside the
    averaged ``state_dict``): every client keeps its own ``r`` as per-client persistent
    state (``ctx.client['fedsr']``, a ``[N, C, z_dim]`` pool). The engine only
    differentiates the model parameters, so ``r`` is trained through the parameter
    ``'reference'`` used as an *offset*: inside the client loss the effective reference is
    ``r_k + (θ_ref − θ_ref,t)`` where ``θ_ref,t`` is the round's global copy. It equals
    ``r_k`` at the first local step and moves exactly as ``r_k`` would under the client
    optimizer (the gradient w.r.t. the offset is the gradient w.r.t. ``r``); after local
    training the client stores ``r_k ← r_k + (θ_ref − θ_ref,t)``, and the server zeroes
    the pseudo-gradient of ``'reference'`` so the global copy never moves and is never
    averaged. Weight decay: coupled decay (client optimizer 'sgd'/'momentum') would
    decay the offset instead of ``r_k``; ``correct_grad`` adds ``wd·(r_k − θ_ref,t)`` so
    ``r_k`` is decayed exactly. Decoupled decay (AdamW, ``client_optimizer='adam'`` with
    ``weight_decay > 0``) cannot be corrected through the gradient, so the registered
    factories exclude ``'reference'`` from AdamW's decay mask in local mode (``r_k`` is
    then not weight-decayed; the official code, with coupled decay, decays it).
  * ``'averaged'``: ``r`` is an ordinary model parameter, trained by the clients and
    averaged by the server like every other parameter.

Message protocol of one round (local mode): the server broadcasts ``w_t`` (its
``'reference'`` entry is a constant placeholder); client ``k`` trains ``w`` and its own
``r_k`` jointly for K local steps, sends ``Δ_k = w_t − w_k`` and keeps ``r_k`` locally.
The ``'reference'`` part of ``Δ_k`` (this round's change of ``r_k``) rides along in the
simulated message only because it is part of the parameter pytree; the server discards
it (a deployment would not send it).

Defaults and sources: ``z_dim=None`` (the task model's representation size: 64 for
FedSR's RotatedMNIST ConvNet, FedSR §4.2; 512 / 2048 for ResNet-18 / -50, FedSR §5),
``weighting='uniform'`` (the server takes the plain mean of the client models: FedSR
eq. 1 and the official ``communicate``; ``'num_examples'`` weights by client size),
``alpha_l2r=1e-2`` and ``alpha_cmi=5e-4`` (the official code's
``--L2R_coeff`` / ``--CMI_coeff`` defaults; the paper defers its tuned values to the
supplement, which is not available), ``mc_samples=20`` (official ``--num_samples``),
``local_steps=5`` and ``batch_size=64`` (FedSR §4.2: E = 5, minibatch 64),
``l2r_squared=True`` (the paper's eq. 10-11 ``‖z‖²``; the official code uses ``‖z‖``:
pass ``l2r_squared=False``), ``sigma_min=1e-5`` (a floor on every standard deviation so
``log σ`` in the KL stays finite; the official code has none). The official code's extra
learnable scalar ``C`` that rescales ``(μ, σ)`` inside the CMI term is not in the paper
and is not implemented.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fedjax_inv import penalties
from fedjax_inv.aggregators import Aggregator
from fedjax_inv.algorithms.base import build, register
from fedjax_inv.core import losses
from fedjax_inv.core.validation import nonneg as _nonneg, pos_int as _pos_int
from fedjax_inv.core.algorithm import Component, Forward
from fedjax_inv.models import FunctionalModel

NAME = "fedsr"
R_MODES = ("local", "averaged")
REFERENCE = "reference"

PyTree = Any


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------


class ClassConditionalGaussian(nnx.Module):
  """Learnable reference ``r(z|y) = N(mu[y], softplus(sigma_raw[y])²)`` (FedSR eq. 17-18).

  Parameters: ``mu [C, z_dim]`` (init 0) and ``sigma_raw [C, z_dim]`` (init 1, i.e.
  ``r_σ = softplus(1) ≈ 1.313``), as in FedSR's official code.
  """

  def __init__(self, num_classes: int, z_dim: int):
    self.mu = nnx.Param(jnp.zeros((num_classes, z_dim), jnp.float32))
    self.sigma_raw = nnx.Param(jnp.ones((num_classes, z_dim), jnp.float32))


def _head_site(base: nnx.Module):
  """Where FedSR's head goes: ``('replace', d_in, d_z)`` when ``base.featurizer`` ends in
  a representation layer ``.projection`` (an ``nnx.Linear``; the ResNets of
  ``models.resnet`` and FedSR's RotatedMNIST ``models.convnet``), else
  ``('append', d, d)`` with ``d`` the featurizer's output size.

  Raises:
    ValueError: no featurizer/classifier, or ``d`` unreadable.
  """
  feat = getattr(base, "featurizer", None)
  cls = getattr(base, "classifier", None)
  proj = getattr(feat, "projection", None)
  if isinstance(proj, nnx.Linear) and cls is not None:
    return "replace", int(proj.in_features), int(proj.out_features)
  if isinstance(cls, nnx.Linear):
    d = int(cls.in_features)
  else:
    d = int(getattr(base, "feature_dim", -1) or -1)
  if cls is None or feat is None or d < 1:
    raise ValueError(
        f"FedSR needs a base model with a .featurizer and a .classifier that is an "
        f"nnx.Linear or whose input size is the model's .feature_dim (to read d); got "
        f"{type(base).__name__} with classifier {type(cls).__name__} and feature_dim "
        f"{getattr(base, 'feature_dim', None)!r}.")
  return "append", d, d


def _num_outputs(base: nnx.Module, d: int) -> int:
  cls = base.classifier
  d_in = int(cls.in_features) if isinstance(cls, nnx.Linear) else d
  return int(jax.eval_shape(lambda: cls(jnp.zeros((1, d_in), jnp.float32))).shape[-1])


class FedSRModel(nnx.Module):
  """A task model with FedSR's representation head (FedSR §3.2, §4.2, §5; official
  ``methods/base.py``).

  Where ``(μ, pre-σ)`` come from — as in the official code, which replaces the backbone's
  last layer (``net.fc = nn.Linear(net.fc.in_features, 2·z_dim)``, μ = first half,
  σ = softplus(second half)):
    * base featurizer ending in a ``.projection`` ``nnx.Linear(d_in → d_z)`` (ResNet-18/50:
      ``d_in`` = 512/2048 pooled trunk features, ``d_z`` = 512/2048; FedSR's RotatedMNIST
      ConvNet: ``d_in`` = flattened conv features, ``d_z`` = 64): the projection is
      **replaced** by ``nnx.Linear(d_in → 2·z_dim)`` (probabilistic) or
      ``nnx.Linear(d_in → z_dim)`` (deterministic); ``z_dim`` defaults to ``d_z``, so the
      representation z is the paper's 512-/2048-/64-d projection itself.
    * any other featurizer ``[B, ...] -> [B, d]`` (MLP, CNN): a layer
      ``nnx.Linear(d → 2·z_dim)`` (or ``z_dim``) is **appended**; ``z_dim`` defaults to
      ``d``.
  ``classifier``: ``nnx.Linear(z_dim, K)``, ``K`` = the base classifier's output size
  (FedSR §4.2: "a single linear layer"; a non-linear base classifier is dropped).
  ``reference`` (only with ``with_reference``): :class:`ClassConditionalGaussian` with
  ``max(K, 2)`` classes. ``feature_dim`` is ``z_dim``.

  Raises:
    ValueError: see :func:`_head_site`; ``z_dim`` not positive.
  """

  def __init__(self, base: nnx.Module, z_dim: int | None, probabilistic: bool,
               with_reference: bool, *, rngs: nnx.Rngs):
    site, d_in, d_z = _head_site(base)
    z_dim = d_z if z_dim is None else int(z_dim)
    if z_dim < 1:
      raise ValueError(f"z_dim={z_dim!r}; it must be a positive int (or None).")
    k = _num_outputs(base, d_z)
    head = nnx.Linear(d_in, 2 * z_dim if probabilistic else z_dim, rngs=rngs)
    if site == "replace":
      base.featurizer.projection = head
      self.featurizer = base.featurizer
    else:
      self.featurizer = nnx.Sequential(base.featurizer, head)
    self.classifier = nnx.Linear(z_dim, k, rngs=rngs)
    if with_reference:
      self.reference = ClassConditionalGaussian(max(k, 2), z_dim)
    self.feature_dim = z_dim

  def __call__(self, x):
    return self.classifier(self.featurizer(x))


class _FedSRFunctional(FunctionalModel):
  """``FunctionalModel`` of :class:`FedSRModel` whose ``init(seed)`` keeps a custom
  initialization of the base's featurizer (e.g. pretrained weights loaded by
  ``models.resnet.with_pretrained``): every featurizer leaf whose path and shape match
  the base's ``init(seed)`` is taken from it, except the replaced ``projection``; the
  head, the classifier and the reference keep their fresh values."""

  def init(self, seed):  # pylint: disable=missing-function-docstring
    params = FunctionalModel.init(self, seed)
    base, site = self._base, self._site
    if type(base).init is FunctionalModel.init:
      return params                      # plain random base: nothing to keep
    old = base.init(seed)["featurizer"]
    if site == "append":
      old = {"layers": {0: old}}

    def merge(new, old, top):
      if isinstance(new, dict):
        return {k: (merge(v, old[k], False) if isinstance(old, dict) and k in old
                    and not (top and site == "replace" and k == "projection") else v)
                for k, v in new.items()}
      return old if getattr(old, "shape", None) == new.shape else new

    return {**params, "featurizer": merge(params["featurizer"], old, True)}


def fedsr_model(base: FunctionalModel, z_dim: int | None = None, probabilistic: bool = True,
                with_reference: bool = True) -> FunctionalModel:
  """FedSR's ``model_transform``: the task's model with the representation head.

  Args:
    base: the task's ``FunctionalModel`` (featurizer ``[B, ...] -> [B, d]``, classifier
      ``[B, d] -> [B, K]``).
    z_dim: representation size; None (default) = the base's own representation size
      (its ``.projection`` output: 512 for ResNet-18, 2048 for ResNet-50, 64 for FedSR's
      RotatedMNIST ConvNet — FedSR §4.2, §5; otherwise the featurizer's output size).
    probabilistic: head outputs ``(μ, pre-σ)`` ``[B, 2·z_dim]`` (True) or ``z [B, z_dim]``.
    with_reference: add the ``'reference'`` parameters of ``r(z|y)`` (CMI term).

  Returns:
    A ``FunctionalModel`` whose params have top-level keys ``'featurizer'``,
    ``'classifier'`` and (with the reference) ``'reference'``; see :class:`FedSRModel`
    for where the head sits. With ``probabilistic=True``, ``features`` returns the
    distribution parameters ``[B, 2·z_dim]``, so predictions must go through the
    component's ``forward`` / ``eval_forward`` (``model.apply`` is not meaningful).
    ``init(seed)`` keeps a custom base initialization (pretrained featurizer weights).

  Raises:
    ValueError: ``z_dim`` neither None nor a positive int; the base's feature size
      unreadable (see :class:`FedSRModel`).

  Source: FedSR §3.2 (probabilistic representation), §4.2, §5 (architecture); official
  code ``methods/base.py`` (``net.fc`` replaced by ``Linear(in, 2·z_dim)``).
  """
  if z_dim is not None:
    _pos_int("z_dim", z_dim)
  site = _head_site(base.factory(nnx.Rngs(0)))[0]
  proto = FunctionalModel.from_factory(
      lambda rngs: FedSRModel(base.factory(rngs), z_dim, bool(probabilistic),
                              bool(with_reference), rngs=rngs))
  m = _FedSRFunctional(proto.factory, proto.graphdef, proto.template, proto.feature_dim)
  object.__setattr__(m, "_base", base)
  object.__setattr__(m, "_site", site)
  return m


def gaussian_params(model: FunctionalModel, params: PyTree, x: jax.Array,
                    sigma_min: float = 1e-5) -> tuple[jax.Array, jax.Array]:
  """``(μ, σ)`` of ``p(z|x)``, each ``[B, z_dim]``; ``σ = softplus(pre-σ) + sigma_min``.

  Source: FedSR §3.2; softplus as in the official code (plus the documented floor).
  """
  h = model.features(params, x)
  mu, pre = jnp.split(h, 2, axis=-1)
  return mu, jax.nn.softplus(pre) + sigma_min


def mc_predict_logits(logits: jax.Array) -> jax.Array:
  """Logits of the Monte-Carlo averaged predictive ``p̂(y|x) = mean_s p̂(y|z_s)``.

  Args:
    logits: ``[S, B, K]`` logits of ``S`` samples ``z_s ~ p(z|x)``. ``K = 1``: binary
      (sigmoid); ``K >= 2``: softmax.

  Returns:
    ``[B, K]``: multiclass ``log mean_s softmax(logits_s)`` (log-probabilities, so a
    softmax of them returns the averaged probabilities); binary ``[B, 1]``
    ``logit(p) = log p − log(1 − p)`` with ``p = mean_s σ(logit_s)``. Both are computed
    with ``logsumexp`` of log-probabilities, so no clipping is needed and nothing
    overflows for any finite logits.

  Source: FedSR eq. 5 (``p̂(y|x) = E_{p(z|x)}[p̂(y|z)]``); official code's
  ``log(mean softmax)`` over ``num_samples`` draws.
  """
  s = logits.shape[0]
  log_s = jnp.log(jnp.asarray(s, logits.dtype))
  if logits.shape[-1] == 1:
    log_p = jax.nn.logsumexp(jax.nn.log_sigmoid(logits), axis=0) - log_s
    log_q = jax.nn.logsumexp(jax.nn.log_sigmoid(-logits), axis=0) - log_s
    return log_p - log_q
  return jax.nn.logsumexp(jax.nn.log_softmax(logits, axis=-1), axis=0) - log_s


# ---------------------------------------------------------------------------------------
# Component
# ---------------------------------------------------------------------------------------


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
    init_client / message / server_update / correct_grad (``r_mode='local'`` with CMI):
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
  try:
    sigma_min = float(sigma_min)
  except (TypeError, ValueError):
    raise ValueError(f"sigma_min={sigma_min!r}; it must be a small positive float.") from None
  if not (math.isfinite(sigma_min) and sigma_min > 0):
    raise ValueError(f"sigma_min={sigma_min!r}; it must be a small positive float "
                     "(e.g. 1e-5).")
  if r_mode not in R_MODES:
    raise ValueError(f"r_mode={r_mode!r}; choose one of {R_MODES}.")
  if not isinstance(l2r_squared, bool):
    raise ValueError(f"l2r_squared={l2r_squared!r}; pass True (paper, ‖z‖²) or False "
                     "(official code, ‖z‖).")
  if not isinstance(probabilistic, bool):
    raise ValueError(f"probabilistic={probabilistic!r}; pass True or False.")
  use_cmi = alpha_cmi > 0
  if use_cmi and not probabilistic:
    raise ValueError(f"alpha_cmi={alpha_cmi} needs probabilistic=True: the CMI term is a "
                     "KL divergence of p(z|x) (FedSR §3.3.2).")
  local = use_cmi and r_mode == "local"

  def forward(model, params, x, key):
    mu, sigma = gaussian_params(model, params, x, sigma_min)
    z = mu + sigma * jax.random.normal(key, mu.shape, mu.dtype)
    return Forward(z=z, logits=model.classify(params, z), aux=(mu, sigma))

  def eval_forward(model, params, x, key):
    mu, sigma = gaussian_params(model, params, x, sigma_min)
    eps = jax.random.normal(key, (mc_samples,) + mu.shape, mu.dtype)
    return mc_predict_logits(model.classify(params, mu + sigma * eps))

  def reference(params, ctx):
    raw = params[REFERENCE]
    if local:
      raw = jax.tree.map(lambda p, r, g: r + (p - g), raw, ctx.client[NAME],
                         ctx.params[REFERENCE])
    return raw["mu"], jax.nn.softplus(raw["sigma_raw"]) + sigma_min

  def loss(model, kind, params, batch, fwd, ctx, key):
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
      kl = penalties.gaussian_kl(mu, sigma, r_mu[y], r_sigma[y])
      total = total + alpha_cmi * losses.weighted_mean(kl, batch.w)
    return total

  hooks = dict(loss=loss)
  if probabilistic:
    hooks.update(forward=forward, eval_forward=eval_forward)
  if local:
    def init_client(params):
      return jax.tree.map(jnp.array, params[REFERENCE])

    def message(model, kind, params0, params, data, ctx, key, local_steps, lr):
      r_new = jax.tree.map(lambda r, p, p0: r + (p - p0), ctx.client[NAME],
                           params[REFERENCE], params0[REFERENCE])
      return (), r_new

    def server_update(state, aggregate, pseudo_grad, ctx):
      return state, {**pseudo_grad,
                     REFERENCE: jax.tree.map(jnp.zeros_like, pseudo_grad[REFERENCE])}

    # init_server: an empty server state keeps ServerState's pytree structure fixed
    # across rounds (server_update writes ``extras['fedsr']``), so the round compiles once.
    hooks.update(init_server=lambda params: (), init_client=init_client, message=message,
                 server_update=server_update,
                 aggregator=Aggregator(lambda m, w: (), lambda s: None, "none"))
    if weight_decay > 0 and client_optimizer in ("sgd", "momentum"):
      # Coupled decay adds wd·θ_ref; the client's r is θ_ref + (r_k − θ_ref,t), so add
      # the constant wd·(r_k − θ_ref,t) to decay r_k itself.
      def correct_grad(grads, ctx):
        fix = jax.tree.map(lambda g, r, p0: g + weight_decay * (r - p0),
                           grads[REFERENCE], ctx.client[NAME], ctx.params[REFERENCE])
        return {**grads, REFERENCE: fix}

      hooks.update(correct_grad=correct_grad)
  return Component(name=NAME, **hooks)


# ---------------------------------------------------------------------------------------
# Registered algorithms
# ---------------------------------------------------------------------------------------


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
            z_dim=None if z_dim is None else int(z_dim), probabilistic=probabilistic, l2r_squared=l2r_squared,
            sigma_min=float(sigma_min))
  if probabilistic:
    hp["mc_samples"] = int(mc_samples)
  if with_ref:
    hp["r_mode"] = r_mode
  if with_ref and r_mode == "local" and alg.hparams["client_optimizer"] == "adam" \
      and alg.hparams["weight_decay"] > 0:
    # AdamW's decoupled decay would act on the offset; keep r_k out of it (module doc).
    alg = alg.replace(client_optimizer=optax.adamw(
        alg.client_lr, weight_decay=alg.hparams["weight_decay"], mask=_decay_mask))
    hp["reference_weight_decay"] = False
  transform = lambda m: fedsr_model(m, z_dim, probabilistic, with_ref)  # noqa: E731
  return alg.replace(model_transform=transform, hparams=hp)


@register("fedsr", paper="FedSR (Nguyen et al. 2022), §3.3 eq. 9-11, 17-18",
          summary="probabilistic representation z~N(mu,sigma) + L2R + CMI (r(z|y) "
                  "local per client by default)")
def fedsr(alpha_l2r: float = 1e-2, alpha_cmi: float = 5e-4, z_dim: int | None = None,
          mc_samples: int = 20, l2r_squared: bool = True, r_mode: str = "local",
          sigma_min: float = 1e-5, local_steps: int = 5, batch_size: int | None = 64,
          weighting: str = "uniform", **kw):
  """FedSR: FedAvg with client objective ``CE + α_L2R ℓ^L2R + α_CMI ℓ^CMI`` (FedSR eq. 9)
  on a probabilistic representation ``z ~ N(μ(x), σ(x)²)``.

  Args:
    alpha_l2r: ``α_L2R >= 0`` (official default 1e-2).
    alpha_cmi: ``α_CMI >= 0`` (official default 5e-4).
    z_dim: representation size; None (default) = the task model's own representation
      size (FedSR §4.2, §5: 64 on RotatedMNIST, 512 ResNet-18, 2048 ResNet-50); see
      :func:`fedsr_model`.
    mc_samples: Monte-Carlo draws averaged at evaluation (official default 20).
    l2r_squared: ``‖z‖²`` (paper eq. 10-11, default) or ``‖z‖`` (official code).
    r_mode: ``'local'`` (per-client ``r(z|y)``, official code) or ``'averaged'``.
    sigma_min: floor added to every softplus standard deviation.
    local_steps, batch_size: FedSR §4.2 (E = 5, minibatch 64).
    weighting: server average of the client models: ``'uniform'`` (default; FedSR eq. 1
      "simple average", official ``communicate``: ``sum(ps)/len(ps)``) or
      ``'num_examples'`` (FedAvg's size weighting ``n_k / n``).
    **kw: the common knobs of ``base.build`` (client_lr, server_lr, ...).

  Raises:
    ValueError: see :func:`fedsr_component`; ``z_dim`` not a positive int; unknown
      keyword.
  """
  _reject_fixed("fedsr", kw, dict(probabilistic=True))
  return _build("fedsr", alpha_l2r=alpha_l2r, alpha_cmi=alpha_cmi, z_dim=z_dim,
                mc_samples=mc_samples, l2r_squared=l2r_squared, r_mode=r_mode,
                probabilistic=True, sigma_min=sigma_min, local_steps=local_steps,
                batch_size=batch_size, weighting=weighting, **kw)


@register("fedl2r", paper="FedSR (Nguyen et al. 2022), §3.3.1 eq. 10-11 (FedL2R)",
          summary="FedAvg + L2 norm of the representation (deterministic z by default)")
def fedl2r(alpha_l2r: float = 1e-2, z_dim: int | None = None, probabilistic: bool = False,
           mc_samples: int = 20, l2r_squared: bool = True, sigma_min: float = 1e-5,
           local_steps: int = 5, batch_size: int | None = 64, weighting: str = "uniform",
           **kw):
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
                local_steps=local_steps, batch_size=batch_size, weighting=weighting, **kw)


@register("fedcmi", paper="FedSR (Nguyen et al. 2022), §3.3.2 eq. 17-18 (FedCMI)",
          summary="probabilistic representation + CMI term KL(p(z|x) || r(z|y))")
def fedcmi(alpha_cmi: float = 5e-4, z_dim: int | None = None, mc_samples: int = 20,
           r_mode: str = "local", sigma_min: float = 1e-5, local_steps: int = 5,
           batch_size: int | None = 64, weighting: str = "uniform", **kw):
  """FedCMI: FedSR's CMI term only (FedSR eq. 17-18) on the probabilistic
  representation. Arguments as in :func:`fedsr`.

  Raises:
    ValueError: see :func:`fedsr`.
  """
  _reject_fixed("fedcmi", kw, dict(alpha_l2r=0.0, l2r_squared=None, probabilistic=True))
  return _build("fedcmi", alpha_l2r=0.0, alpha_cmi=alpha_cmi, z_dim=z_dim,
                mc_samples=mc_samples, l2r_squared=True, r_mode=r_mode,
                probabilistic=True, sigma_min=sigma_min, local_steps=local_steps,
                batch_size=batch_size, weighting=weighting, **kw)
