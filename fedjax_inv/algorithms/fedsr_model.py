"""FedSR's model (Nguyen, Torr & Lim 2022, §3.2, §4.2): the task's model rebuilt with a
probabilistic representation head ``p(z|x) = N(μ(x), σ(x)²)``, a linear classifier on
``z`` and, with the CMI term, the reference ``r(z|y)``; the Monte-Carlo prediction. The
algorithm (loss terms, per-client ``r``) is ``fedsr.py``; readings: docs/ALGORITHMS.md#fedsr.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from fedjax_inv.core.validation import pos_int as _pos_int
from fedjax_inv.models import FunctionalModel

REFERENCE = "reference"  # top-level parameter holding r(z|y)

PyTree = Any


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
