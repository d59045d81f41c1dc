"""The FedILC family (Zhu, Ezzine, Liu, Bengio) and its FedCurv baseline.

Registry names (FedILC §5 lists all of them as the methods it compares):

* ``geometric`` — FedSGD whose client gradients are combined with the weighted geometric
  mean (FedILC §3.1) instead of the arithmetic mean.
* ``fishr_inter_geo`` — Fishr+Inter-Geo (FedILC §3.2, Alg. 1):
  ``w ← w − η(∇^∧F + λ∇L_Fishr)``, ``∇^∧F`` the weighted geometric mean of the client
  gradients.
* ``fishr_intra_geo`` — Fishr+Intra-Geo (FedILC §3.3, Alg. 2): every client's gradient is
  the weighted geometric mean of its mini-batch gradients (default: FedILC §5's "scalable
  solution" as the official code runs it, mini-batches of ``intra_group_size=32``
  reshuffled every round, exact zeros counted as negative; ``intra_group_size=None`` is
  Alg. 2's literal per-example version); the server takes their arithmetic mean and adds
  ``λ∇L_Fishr``.
* ``fishr_intra_arith`` — Fishr+Intra-Arith (FedILC §5 baseline): FedSGD + ``λ∇L_Fishr``.
* ``fedcurv`` — FedCurv as FedILC's tables run it (FedILC §5; the official README's
  "fishr: FedCurv"): FedSGD + ``λ∇L_Fishr`` (arithmetic mean of full-client gradients).
* ``fedcurv_shoham`` — Shoham et al. 2019's FedCurv ("Overcoming Forgetting in Federated
  Learning on Non-IID Data"): local training with the penalty
  ``λ Σ_{j≠i} Σ_k F_{j,k}(θ_k − θ̂_{j,k})²`` built from the other clients' diagonal
  Fisher information ``F_j`` and models ``θ̂_j``.

Task settings: the FedSGD-type methods drop a task's client recipe, so every task that
FedILC uses gives their server settings in ``defaults['per_algorithm']``, built by
``fedilc_task_settings`` (lr / wd / λ / Intra-Geo batch of FedILC §5.1 and the official
commands).

The five FedSGD-type methods fix the client recipe (registered with
``fixed=FEDSGD_FIXED``, so a task's client defaults are not passed to them; their
``weight_decay`` is the server's): one local step of ``sgd(1.0)`` on the
client's batch at the global model ``w_t`` (the whole client data when ``batch_size`` is
None), so the pseudo-gradient ``w_t − (w_t − g)`` *is* the client gradient ``g`` (up to
the float32 rounding of ``w_t − g``: an error of at most half an ulp of ``w_t``, so a
gradient coordinate smaller than that arrives as an exact zero). The server optimizer
follows FedILC §5.1 and its official code: ``torch.optim.Adam(lr, weight_decay=wd)``, i.e.
Adam with *coupled* L2 (``server_optimizer='adam'``, default; ``server_lr=3e-4``,
``weight_decay=0.01``, the Color-MNIST values), applied to the aggregated
pseudo-gradient; ``'adamw'`` (decoupled decay) and ``'sgd'`` (the update ``w − η(…)`` of
Alg. 1-2 literally) are options.

Fishr message protocol (one round, ``E`` = the clients sampled this round):
  1. pre-stage, at the global model ``θ = w_t``: client ``e`` sends ``v_e = C_e(θ)``, the
     diagonal of the per-example gradient covariance of the final linear classifier on
     its (unpadded) data, and ``‖v_e‖²``. The server takes the *uniform* mean
     ``v̄ = (1/E) Σ_e v_e`` and stores it (and ``L_Fishr = mean‖v_e‖² − ‖v̄‖²``, the
     penalty value, for inspection) in its component state, which it broadcasts;
  2. main stage: besides its gradient, client ``e`` sends its vector-Jacobian product
     ``2(v_e − v̄)ᵀ ∂v_e/∂θ`` (with respect to ALL parameters: ``C_e`` depends on the
     featurizer through the features);
  3. the server takes their uniform mean, which is exactly
     ``∇_θ L_Fishr = ∇_θ (1/E) Σ_e ‖v_e − v̄‖²`` (the ``∂v̄/∂θ`` terms cancel because
     ``Σ_e (v_e − v̄) = 0``), and adds ``λ`` times it to the pseudo-gradient before the
     server optimizer.
Only classifier-sized vectors ``v_e`` and one parameter-sized VJP per client travel; the
result equals ``jax.grad`` of ``L_Fishr`` through the vmapped clients.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_inv import aggregators as aggs
from fedjax_inv import penalties
from fedjax_inv.algorithms import base
from fedjax_inv.algorithms.base import FEDSGD_FIXED, register, uniform_mean
from fedjax_inv.core import losses
from fedjax_inv.core.algorithm import Algorithm, Batch, Component, hparam
from fedjax_inv.core.validation import choice as _choice, finite as _finite, nonneg as _nonneg
from fedjax_inv.core.validation import pos_int as _pos_int, positive as _positive

PyTree = Any

SERVER_OPTIMIZERS = ("adamw", "adam", "sgd")
ZEROS = ("both", "negative")
WEIGHTINGS = ("num_examples", "uniform")

_FEDSGD_FIXED = ("client_lr", "local_steps", "client_optimizer")


# ---------------------------------------------------------------------------------------
# Validation helpers (all raise ValueError in the factory, before anything is compiled)
# ---------------------------------------------------------------------------------------


def _check_unknown(name: str, unknown: dict, accepted) -> None:
  if not unknown:
    return
  fixed = sorted(k for k in unknown if k in _FEDSGD_FIXED)
  if fixed:
    raise ValueError(
        f"{name} is a FedSGD-type method and fixes {fixed} (one local step of sgd(1.0), so "
        "the client sends its gradient); tune server_lr / server_optimizer / weight_decay "
        "instead.")
  raise ValueError(f"algorithm {name!r} got unknown hyperparameters {sorted(unknown)}; "
                   f"it accepts {sorted(accepted)}.")


def server_optimizer(name: str = "adam", lr: float = 3e-4, weight_decay: float = 0.01,
                     b1: float = 0.9, b2: float = 0.999,
                     eps: float = 1e-8) -> optax.GradientTransformation:
  """The FedILC server optimizer on the aggregated pseudo-gradient.

  Args:
    name: ``'adam'`` (default) — coupled L2: the decay ``wd·w`` is added to the
      pseudo-gradient before bias-corrected Adam, as ``torch.optim.Adam(weight_decay=wd)``
      does (FedILC's official code); ``'adamw'`` — ``optax.adamw`` (decoupled weight
      decay ``w ← w − η(m̂/(√v̂+ε) + wd·w)``); ``'sgd'`` — ``w ← w − η(g + wd·w)``,
      Alg. 1-2's update literally.
    lr: server learning rate ``η`` (> 0).
    weight_decay: ``wd >= 0`` (per round, unitless).
    b1, b2, eps: Adam's moment decays and epsilon (torch/optax defaults).

  Returns:
    ``optax.GradientTransformation``; its ``update`` needs the params (the engine passes
    them).

  Raises:
    ValueError: unknown ``name``; ``lr <= 0``; ``weight_decay < 0``; ``b1``/``b2`` outside
      [0, 1); ``eps <= 0``.

  Source: FedILC §5.1.1-5.1.3 (Adam, lr 3e-4 / 1e-4 / 2e-4, weight decay 0.01 / 1e-3 /
  1e-3).
  """
  _choice("server_optimizer", name, SERVER_OPTIMIZERS)
  lr = _positive("server_lr", lr)
  wd = _nonneg("weight_decay", weight_decay)
  for nm, b in (("b1", b1), ("b2", b2)):
    b = _finite(nm, b, "use a number in [0, 1)")
    if not 0.0 <= b < 1.0:
      raise ValueError(f"{nm}={b!r}; Adam's moment decay must be in [0, 1).")
  eps = _positive("eps", eps)
  if name == "adamw":
    return optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=wd)
  inner = optax.adam(lr, b1=b1, b2=b2, eps=eps) if name == "adam" else optax.sgd(lr)
  return optax.chain(optax.add_decayed_weights(wd), inner) if wd else inner


_server_opt = server_optimizer  # the factories' ``server_optimizer`` kwarg shadows the name


# ---------------------------------------------------------------------------------------
# Per-example sums, chunked (bounded memory: chunk × parameters)
# ---------------------------------------------------------------------------------------


def _sum_over_examples(fn: Callable, x, y, w, chunk: int):
  """``Σ_i fn(x_i, y_i, w_i)`` over the ``B`` examples of ``x [B, ...]``, ``y [B]``,
  ``w [B]``: ``vmap`` within chunks of ``chunk`` examples, ``lax.scan`` across chunks.
  The tail is padded with weight-0 examples, which ``fn`` must map to zero statistics."""
  b = x.shape[0]
  s = max(1, min(int(chunk), b))
  pad = (-b) % s
  if pad:
    x = jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)])
    y = jnp.concatenate([y, jnp.zeros((pad,) + y.shape[1:], y.dtype)])
    w = jnp.concatenate([w, jnp.zeros((pad,), w.dtype)])
  k = (b + pad) // s

  def chunk_sum(xc, yc, wc):
    return jax.tree.map(lambda a: jnp.sum(a, axis=0), jax.vmap(fn)(xc, yc, wc))

  if k == 1:
    return chunk_sum(x, y, w)
  xs, ys, ws = (a.reshape((k, s) + a.shape[1:]) for a in (x, y, w))
  zeros = jax.tree.map(lambda t: jnp.zeros(t.shape, t.dtype),
                       jax.eval_shape(chunk_sum, xs[0], ys[0], ws[0]))

  def body(carry, inp):
    return jax.tree.map(jnp.add, carry, chunk_sum(*inp)), None

  out, _ = jax.lax.scan(body, zeros, (xs, ys, ws))
  return out


def _zero_where(keep, tree):
  return jax.tree.map(lambda a: jnp.where(keep, a, jnp.zeros_like(a)), tree)


# ---------------------------------------------------------------------------------------
# Fishr (FedILC §3.2): pre-stage v_e → v̄, main-stage VJP, server adds λ·mean VJP
# ---------------------------------------------------------------------------------------


def client_grad_variance(model, kind: str, params: PyTree, x, y, n) -> dict:
  """``v_e = C_e``: per-coordinate variance over the client's examples of the per-example
  gradients of the final linear classifier, at ``params``.

  Args:
    model: ``FunctionalModel`` (featurizer → ``z [n_max, d]``, linear classifier).
    kind: 'binary' | 'multiclass' (Fishr needs a likelihood over classes).
    params: model parameters (differentiable: featurizer and classifier).
    x: ``[n_max, ...]`` client inputs, padded; y: ``[n_max]`` labels; n: true size.

  Returns:
    ``{'kernel': [d, K], 'bias': [K]}`` (``K = 1`` for binary): the biased (``1/n_e``)
    variance over the ``n`` real examples; padded rows have weight 0.

  Raises:
    ValueError: ``kind == 'regression'`` (raised while tracing the round).

  Source: FedILC §3.2 (C_e) with §5's diagonal, classifier-only simplification;
  ``penalties.per_sample_classifier_grad_variance``.
  """
  if kind not in ("binary", "multiclass"):
    raise ValueError(f"Fishr (FedILC §3.2) needs a classification task; got loss kind "
                     f"{kind!r}. Use 'geometric' or 'fedcurv' for regression.")
  w = (jnp.arange(x.shape[0]) < n).astype(jnp.float32)
  z = model.features(params, x)
  logits = model.classify(params, z)
  return penalties.per_sample_classifier_grad_variance(z, logits, y, w)


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
  * ``server_update``: ``pseudo_grad + λ · mean_e VJP_e`` (``= λ∇L_Fishr``).

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

  Source: FedILC §3.2 (L_Fishr, eq. for w_{t+1}), Alg. 1-2; DESIGN.md §1.
  """
  lam = _nonneg("fishr_lambda", fishr_lambda)
  _choice("fishr_reduction", reduction, FISHR_REDUCTIONS)
  summed = reduction == "sum"

  def init_server(params):
    cls = params["classifier"]
    return {"mean_var": {"kernel": jnp.zeros_like(cls["kernel"]),
                         "bias": jnp.zeros_like(cls["bias"])},
            "penalty": jnp.zeros((), jnp.float32)}

  def pre_message(model, kind, params, data, ctx, key):
    x, y, n = data
    v = client_grad_variance(model, kind, params, x, y, n)
    sq = sum(jnp.sum(a * a) for a in jax.tree.leaves(v))
    return {"v": v, "sq": sq}

  def pre_update(state, mean, ctx):
    v_bar = mean["v"]
    sq_bar = sum(jnp.sum(a * a) for a in jax.tree.leaves(v_bar))
    pen = mean["sq"] - sq_bar
    if summed:
      pen = pen * ctx.cohort
    return {"mean_var": v_bar, "penalty": pen.astype(jnp.float32)}

  def message(model, kind, params0, params, data, ctx, key, local_steps, lr):
    x, y, n = data
    v_bar = ctx.extras["fishr"]["mean_var"]
    v, vjp_fn = jax.vjp(lambda p: client_grad_variance(model, kind, p, x, y, n), params0)
    cot = jax.tree.map(lambda a, b: 2.0 * (a - b), v, v_bar)
    (g,) = vjp_fn(cot)
    return g, None

  def server_update(state, mean_vjp, pseudo_grad, ctx):
    lam_t = hparam(ctx, "fishr_lambda", None)  # a batched sweep replica's traced λ
    if lam_t is None:
      if lam == 0.0:  # exactly the pseudo-gradient (even if a VJP were not finite)
        return state, pseudo_grad
      lam_t = lam
    scale = lam_t * ctx.cohort if summed else lam_t
    return state, jax.tree.map(lambda p, g: p + scale * g, pseudo_grad, mean_vjp)

  return Component(name="fishr", init_server=init_server, pre_message=pre_message,
                   pre_aggregator=uniform_mean(), pre_update=pre_update, message=message,
                   aggregator=uniform_mean(), server_update=server_update,
                   traced=("fishr_lambda",))


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

  Dense models: when the engine passes ``model``/``kind`` (it does when the client
  objective is the task loss alone) and the model has a ``dense_chain`` (``models.mlp``),
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
  groups = _pos_int("intra_groups", groups, allow_none=True,
                    none_means="one environment per example")
  group_size = _pos_int("intra_group_size", group_size, allow_none=True,
                        none_means="use intra_groups / per example")
  if not isinstance(shuffle, bool):
    raise ValueError(f"intra_shuffle={shuffle!r}; use True or False.")
  chunk = _pos_int("intra_chunk", chunk)
  _choice("zeros", zeros, ZEROS)
  agg = aggs.geometric_mean_aggregator(zeros)

  def per_example(value_and_grad_fn, params, key):
    def one(xi, yi, wi):
      keep = wi > 0
      xi = jnp.where(keep, xi, jnp.zeros_like(xi))
      loss, g = value_and_grad_fn(params, Batch(x=xi[None], y=yi[None], w=wi[None]), key)
      g = _zero_where(keep, g)
      loss = jnp.where(keep, loss, 0.0)
      return agg.lift(g, wi), wi * loss, wi
    return one

  def minibatch_groups(value_and_grad_fn, params, batch, key):
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
      keep = size > 0
      xg = jnp.where((wg > 0).reshape((-1,) + (1,) * (xg.ndim - 1)), xg,
                     jnp.zeros_like(xg))
      loss, g = value_and_grad_fn(params, Batch(x=xg, y=yg, w=wg), key)
      return agg.lift(_zero_where(keep, g), size), size * jnp.where(keep, loss, 0.0), size

    out = jax.vmap(group)(xs, ys, ws)
    return jax.tree.map(lambda a: jnp.sum(a, axis=0), out)

  def grad_estimator(value_and_grad_fn, params, batch, ctx, key, model=None, kind=None):
    w = batch.w.astype(jnp.float32)
    if group_size is not None:
      stats, loss_sum, wsum = minibatch_groups(value_and_grad_fn, params, batch, key)
      return loss_sum / jnp.maximum(wsum, 1e-12), agg.finalize(stats)
    if groups is None and model is not None and getattr(model, "dense_chain", None):
      return _dense_per_example_wgm(model, kind, params, batch, agg, zeros)
    if groups is None:
      stats, loss_sum, wsum = _sum_over_examples(
          per_example(value_and_grad_fn, params, key), batch.x, batch.y, w, chunk)
    else:
      real = w > 0
      rank = jnp.cumsum(real.astype(jnp.int32)) - 1
      n_real = jnp.maximum(jnp.sum(real.astype(jnp.int32)), 1)
      gid = jnp.where(real, (rank * groups) // n_real, -1)

      def group(j):
        wj = jnp.where(gid == j, w, 0.0)
        size = jnp.sum(wj)
        loss, g = value_and_grad_fn(params, Batch(x=batch.x, y=batch.y, w=wj), key)
        keep = size > 0
        return agg.lift(_zero_where(keep, g), size), size * jnp.where(keep, loss, 0.0), size

      out = jax.vmap(group)(jnp.arange(groups))
      stats, loss_sum, wsum = jax.tree.map(lambda a: jnp.sum(a, axis=0), out)
    grads = agg.finalize(stats)
    return loss_sum / jnp.maximum(wsum, 1e-12), grads

  return Component(name="intra_geo", grad_estimator=grad_estimator)


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


# ---------------------------------------------------------------------------------------
# Factories
# ---------------------------------------------------------------------------------------

_SERVER_KW = ("server_optimizer", "server_lr", "weight_decay", "b1", "b2", "eps")


def _server_hparams(server_optimizer, server_lr, weight_decay, b1, b2, eps):
  opt = _server_opt(server_optimizer, server_lr, weight_decay, b1, b2, eps)
  hp = dict(server_optimizer=server_optimizer, server_lr=float(server_lr),
            weight_decay=float(weight_decay))
  if server_optimizer in ("adamw", "adam"):
    hp.update(b1=float(b1), b2=float(b2), eps=float(eps))
  return opt, hp


def _fedsgd_type(name: str, *, aggregator: aggs.Aggregator, components: tuple,
                 batch_size, weighting: str, server: tuple, extra_hp: dict) -> Algorithm:
  """One local ``sgd(1.0)`` step per round (FedSGD), the given aggregator/components."""
  batch_size = _pos_int("batch_size", batch_size, allow_none=True,
                        none_means="the full client data")
  _choice("weighting", weighting, WEIGHTINGS)
  opt, hp = _server_hparams(*server)
  hp = dict(client_optimizer="sgd", client_lr=1.0, local_steps=1, batch_size=batch_size,
            weighting=weighting, aggregator=aggregator.name, **hp, **extra_hp)
  return Algorithm(name=name, client_optimizer=optax.sgd(1.0), server_optimizer=opt,
                   local_steps=1, batch_size=batch_size, aggregator=aggregator,
                   weighting=weighting, components=tuple(components), client_lr=1.0,
                   hparams=hp)


_COMMON = ("batch_size", "weighting") + _SERVER_KW


@register("geometric", paper="FedILC §3.1, §5 (Geometric baseline)",
          summary="FedSGD with the weighted geometric mean of client gradients, server Adam",
          fixed=FEDSGD_FIXED)
def geometric(*, server_optimizer: str = "adam", server_lr: float = 3e-4,
              weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-8, batch_size=None, zeros: str = "negative",
              weighting: str = "num_examples", **unknown) -> Algorithm:
  """Geometric: ``w ← server_opt(w, wgm_e(g_e))``, ``g_e`` client ``e``'s gradient at ``w``.

  FedSGD clients (one ``sgd(1.0)`` step on ``batch_size`` examples, or the whole client
  data when None), aggregated with the weighted geometric mean
  ``wgm(G) = |E+|/|E|·(Π_{E+}|g|)^{1/|E+|} − |E−|/|E|·(Π_{E−}|g|)^{1/|E−|}`` per
  coordinate. The formula has no client weights: every sampled client counts once
  (``weighting`` only weights the reported train loss).

  Args:
    server_optimizer, server_lr, weight_decay, b1, b2, eps: see ``server_optimizer``
      (defaults: FedILC §5.1.1 Color-MNIST, lr 3e-4, wd 0.01, ``'adam'`` = coupled L2
      as the official code's ``torch.optim.Adam(weight_decay=wd)``; tasks set theirs
      through ``fedilc_task_settings``).
    batch_size: None (full client batch) or examples per local step (with replacement).
    zeros: 'negative' (default: FedILC's official code, ``sign > 0`` is E+, every other
      value E−) or 'both' (the paper's §3.1 text, a zero in both sets, which zeroes that
      coordinate) — where an exact zero gradient goes; see
      ``aggregators.weighted_geometric_mean``.
    weighting: 'num_examples' | 'uniform'.

  Returns:
    ``Algorithm`` (``hparams`` records every value above).

  Raises:
    ValueError: any bad value (named, with the fix); ``client_lr`` / ``local_steps`` /
      ``client_optimizer`` (fixed by FedSGD) or any unknown keyword.

  Source: FedILC §3.1 (weightedgeo, ``w ← w − η∇^∧F``), §5 (Geometric baseline).
  """
  _check_unknown("geometric", unknown, _COMMON + ("zeros",))
  _choice("zeros", zeros, ZEROS)
  return _fedsgd_type(
      "geometric", aggregator=aggs.geometric_mean_aggregator(zeros), components=(),
      batch_size=batch_size, weighting=weighting,
      server=(server_optimizer, server_lr, weight_decay, b1, b2, eps),
      extra_hp=dict(zeros=zeros))


@register("fishr_inter_geo", paper="FedILC §3.2, Alg. 1 (Fishr+Inter-Geo)",
          summary="weighted geometric mean of client gradients + lambda * grad Fishr "
                  "(VJP protocol), server Adam",
          fixed=FEDSGD_FIXED)
def fishr_inter_geo(*, fishr_lambda: float = 15.0, fishr_reduction: str = "sum", server_optimizer: str = "adam",
                    server_lr: float = 3e-4, weight_decay: float = 0.01, b1: float = 0.9,
                    b2: float = 0.999, eps: float = 1e-8, batch_size=None,
                    zeros: str = "negative", weighting: str = "num_examples",
                    **unknown) -> Algorithm:
  """Fishr+Inter-Geo: ``w ← server_opt(w, ∇^∧F + λ∇L_Fishr)`` (FedILC Alg. 1).

  ``∇^∧F`` = weighted geometric mean of the FedSGD client gradients (as ``geometric``);
  ``L_Fishr = (1/E) Σ_e ‖C_e − C̄‖²`` over the sampled clients, ``C_e`` the diagonal
  per-example gradient variance of the final linear classifier on client ``e``'s full
  data at ``w``; ``∇L_Fishr`` w.r.t. all parameters, computed by the message protocol of
  ``fishr_component`` (clients send ``v_e``, the server returns ``v̄``, clients send their
  VJP ``2(v_e − v̄)ᵀ∂v_e/∂θ``, the server averages). ``fishr_lambda=0`` gives
  ``geometric`` exactly.

  Args:
    fishr_lambda: ``λ >= 0`` (FedILC §5.1.1: 15.0 for Color-MNIST).
    fishr_reduction: ``'sum'`` (default; ``L_Fishr = Σ_e ‖C_e − C̄‖²`` as the official
      code, the scale of the published λ) or ``'mean'`` (Alg. 1's ``1/E``); see
      ``fishr_component``.
    others: as ``geometric``.

  Raises:
    ValueError: as ``geometric``; ``fishr_lambda`` negative or not finite.

  Source: FedILC §3.2, Alg. 1.
  """
  _check_unknown("fishr_inter_geo", unknown, _COMMON + ("zeros", "fishr_lambda", "fishr_reduction"))
  _choice("zeros", zeros, ZEROS)
  return _fedsgd_type(
      "fishr_inter_geo", aggregator=aggs.geometric_mean_aggregator(zeros),
      components=(fishr_component(fishr_lambda, fishr_reduction),), batch_size=batch_size,
      weighting=weighting, server=(server_optimizer, server_lr, weight_decay, b1, b2, eps),
      extra_hp=dict(zeros=zeros, fishr_lambda=float(fishr_lambda),
                    fishr_reduction=fishr_reduction))


@register("fishr_intra_geo", paper="FedILC §3.3, Alg. 2 (Fishr+Intra-Geo)",
          summary="client gradient = weighted geometric mean of per-example (or "
                  "mini-batch) gradients, arithmetic mean across clients + lambda * grad "
                  "Fishr, server Adam",
          fixed=FEDSGD_FIXED)
def fishr_intra_geo(*, fishr_lambda: float = 15.0, fishr_reduction: str = "sum",
                    intra_group_size=32, intra_shuffle: bool = True, intra_groups=None,
                    intra_chunk: int = 64,
                    server_optimizer: str = "adam", server_lr: float = 3e-4,
                    weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
                    eps: float = 1e-8, batch_size=None, zeros: str = "negative",
                    weighting: str = "num_examples", **unknown) -> Algorithm:
  """Fishr+Intra-Geo: ``w ← server_opt(w, mean_e ∇^∧F_e + λ∇L_Fishr)`` (FedILC Alg. 2).

  Client ``e`` sends ``∇^∧F_e``, the weighted geometric mean of the gradients of its
  mini-batches of ``intra_group_size`` examples (default 32, reshuffled every round, exact
  zeros counted as negative: what FedILC §5's "scalable solution" and the official code
  run — ``DataLoader(batch_size=32, shuffle=True)``, ``sign > 0`` as E+). Options: the
  literal Alg. 2 (each example an environment: ``intra_group_size=None``; on ReLU nets
  with ``zeros='both'`` this gives exactly zero hidden-weight gradients, because every
  coordinate has some example with an exact-zero gradient, so it does not train: 0.51 /
  0.51 accuracy after 100 rounds on Color-MNIST, issue 9); or ``m`` contiguous groups
  (``intra_group_size=None, intra_groups=m``). See ``intra_geo_component``. The server averages them arithmetically (weighted by client
  size with ``weighting='num_examples'``, the FedSGD convention; ``'uniform'`` for Alg. 2's
  plain mean) and adds ``λ∇L_Fishr`` (``fishr_component``).

  Args:
    fishr_lambda: ``λ >= 0``.
    fishr_reduction: ``'sum'`` (official code, default) | ``'mean'``; see
      ``fishr_component``.
    intra_group_size: examples per mini-batch group (default 32: the official Color-MNIST
      batch; the Rotated-CIFAR10 / eICU tasks set 64), or None to use ``intra_groups``.
    intra_shuffle: reshuffle the examples into groups every round (default True).
    intra_groups: with ``intra_group_size=None``: None (per example, Alg. 2 literally) or
      ``m >= 1`` contiguous groups.
    intra_chunk: examples per vectorized chunk of per-example gradients (memory knob; the
      result does not depend on it).
    others: as ``geometric``.

  Raises:
    ValueError: as ``geometric``; bad ``fishr_lambda``, ``fishr_reduction``,
      ``intra_group_size``, ``intra_shuffle``, ``intra_groups``, ``intra_chunk``.

  Source: FedILC §3.3, Alg. 2; §5 (mini-batch geometric mean).
  """
  _check_unknown("fishr_intra_geo", unknown,
                 _COMMON + ("zeros", "fishr_lambda", "fishr_reduction", "intra_groups",
                             "intra_group_size", "intra_shuffle", "intra_chunk"))
  comp = intra_geo_component(intra_groups, intra_chunk, zeros, intra_group_size,
                             intra_shuffle)
  return _fedsgd_type(
      "fishr_intra_geo", aggregator=aggs.weighted_mean(),
      components=(comp, fishr_component(fishr_lambda, fishr_reduction)), batch_size=batch_size,
      weighting=weighting, server=(server_optimizer, server_lr, weight_decay, b1, b2, eps),
      extra_hp=dict(zeros=zeros, fishr_lambda=float(fishr_lambda),
                    fishr_reduction=fishr_reduction,
                    intra_group_size=intra_group_size, intra_shuffle=intra_shuffle,
                    intra_groups=intra_groups, intra_chunk=int(intra_chunk)))


@register("fishr_intra_arith", paper="FedILC §5 (Fishr+Intra-Arith baseline)",
          summary="FedSGD (arithmetic mean of client gradients) + lambda * grad Fishr, "
                  "server Adam",
          fixed=FEDSGD_FIXED)
def fishr_intra_arith(*, fishr_lambda: float = 15.0, fishr_reduction: str = "sum", server_optimizer: str = "adam",
                      server_lr: float = 3e-4, weight_decay: float = 0.01, b1: float = 0.9,
                      b2: float = 0.999, eps: float = 1e-8, batch_size=None,
                      weighting: str = "num_examples", **unknown) -> Algorithm:
  """Fishr+Intra-Arith: ``w ← server_opt(w, Σ_e n_e g_e / Σ n_e + λ∇L_Fishr)``.

  The arithmetic-mean comparison of FedILC §5: the client gradient is its examples'
  arithmetic mean gradient (FedSGD), client gradients are averaged weighted by client size
  (``weighting``), plus the Fishr term of ``fishr_component``. With ``fishr_lambda=0`` it
  is FedSGD with FedILC's server optimizer.

  Args:
    fishr_lambda: ``λ >= 0``.
    server_optimizer, server_lr, weight_decay, b1, b2, eps, batch_size, weighting: as
      ``geometric``.

  Returns:
    ``Algorithm`` (``hparams`` records every value).

  Raises:
    ValueError: as ``fishr_inter_geo``.

  Source: FedILC §5 (baselines), Alg. 2 with arithmetic instead of geometric means.
  """
  _check_unknown("fishr_intra_arith", unknown, _COMMON + ("fishr_lambda", "fishr_reduction"))
  return _fedsgd_type(
      "fishr_intra_arith", aggregator=aggs.weighted_mean(),
      components=(fishr_component(fishr_lambda, fishr_reduction),), batch_size=batch_size,
      weighting=weighting, server=(server_optimizer, server_lr, weight_decay, b1, b2, eps),
      extra_hp=dict(fishr_lambda=float(fishr_lambda),
                    fishr_reduction=fishr_reduction))


@register("fedcurv_shoham", paper="Shoham et al. 2019 (FedCurv)",
          summary="local training + lambda * sum_{j!=i} F_j (theta - theta_j)^2 from pool "
                  "sums of diagonal Fishers (Shoham et al.'s FedCurv), server Adam",
          fixed=("weight_decay",))
def fedcurv_shoham(*, curv_lambda: float = 1.0, client_optimizer: str = "sgd",
            client_lr: float = 1.0, local_steps: int = 1, batch_size=None,
            client_weight_decay: float = 0.0, fisher_chunk: int = 64,
            server_optimizer: str = "adam", server_lr: float = 3e-4,
            weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8, weighting: str = "num_examples", **unknown) -> Algorithm:
  """Shoham et al.'s FedCurv: clients minimize
  ``L_i(θ) + λ Σ_{j≠i} Σ_k F_{j,k}(θ_k − θ̂_{j,k})²``.

  Not the "FedCurv" of FedILC's tables: that one is FedSGD + Fishr (registry ``fedcurv``,
  as FedILC's README and code say). This is the method of Shoham et al. 2019.

  ``θ̂_j``, ``F_j``: the final local model and its empirical diagonal Fisher
  (``diagonal_fisher``) that pool client ``j`` sent the last time it participated
  (clients never sampled contribute nothing). Implemented with pool sums (see
  ``fedcurv_component``). The pseudo-gradients ``w − θ̂_i`` are averaged (weighted by
  client size with ``weighting='num_examples'``) and fed to the server optimizer.

  ``weight_decay`` is the *server* optimizer's decay, as for the other FedILC methods (so
  the registry marks it ``fixed``: a task's client weight decay is not routed to it; pass
  ``client_weight_decay`` for the clients).

  Defaults put FedCurv on FedILC's footing (one full-batch ``sgd(1.0)`` step, i.e. FedSGD
  plus the curvature term, server Adam lr 3e-4 wd 0.01); Shoham et al.'s setting is
  FedAvg-type local training (``local_steps > 1``, smaller ``client_lr``, server
  ``'sgd'`` with ``server_lr=1``, ``weight_decay=0``).

  Args:
    curv_lambda: ``λ >= 0`` (not given by FedILC; 1.0 here).
    client_optimizer, client_lr, local_steps, batch_size, client_weight_decay: local
      training (``base.client_optimizer``: 'sgd' | 'momentum' | 'adam').
    fisher_chunk: examples per vectorized chunk of per-example gradients (memory knob).
    server_optimizer, server_lr, weight_decay, b1, b2, eps: see ``server_optimizer``.
    weighting: 'num_examples' | 'uniform'.

  Raises:
    ValueError: any bad value (named, with the fix) or unknown keyword.

  Source: Shoham et al. 2019 §3-4; FedILC §5 (baseline, server Adam §5.1).
  """
  _check_unknown("fedcurv_shoham", unknown,
                 ("curv_lambda", "client_optimizer", "client_lr", "local_steps",
                  "client_weight_decay", "fisher_chunk") + _COMMON)
  local_steps = _pos_int("local_steps", local_steps)
  batch_size = _pos_int("batch_size", batch_size, allow_none=True,
                        none_means="the full client data")
  cwd = _nonneg("client_weight_decay", client_weight_decay)
  _positive("client_lr", client_lr)
  _choice("weighting", weighting, WEIGHTINGS)
  copt = base.client_optimizer(client_optimizer, client_lr, weight_decay=cwd)
  comp = fedcurv_component(curv_lambda, fisher_chunk)
  opt, hp = _server_hparams(server_optimizer, server_lr, weight_decay, b1, b2, eps)
  hp = dict(curv_lambda=float(curv_lambda), client_optimizer=client_optimizer,
            client_lr=float(client_lr), local_steps=local_steps, batch_size=batch_size,
            client_weight_decay=cwd, fisher_chunk=int(fisher_chunk), weighting=weighting,
            aggregator="mean", **hp)
  return Algorithm(name="fedcurv_shoham", client_optimizer=copt, server_optimizer=opt,
                   local_steps=local_steps, batch_size=batch_size,
                   aggregator=aggs.weighted_mean(), weighting=weighting,
                   components=(comp,), client_lr=float(client_lr), hparams=hp)


@register("fedcurv", paper="FedILC §5 (FedCurv baseline = FedSGD + Fishr, official README)",
          summary="FedILC's FedCurv: FedSGD (arithmetic mean of full-client gradients) + "
                  "lambda * grad Fishr, server Adam",
          fixed=FEDSGD_FIXED)
def fedcurv(*, fishr_lambda: float = 15.0, fishr_reduction: str = "sum",
            server_optimizer: str = "adam", server_lr: float = 3e-4,
            weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8, batch_size=None, weighting: str = "num_examples",
            **unknown) -> Algorithm:
  """FedCurv as FedILC's tables run it: ``w ← server_opt(w, Σ_e n_e g_e/Σ n_e + λ∇L_Fishr)``.

  FedILC §5 describes its FedCurv baseline as "integrates with vanilla Fishr
  regularization"; the official code's ``--algorithm=fishr`` (README: "FedCurv") is the
  arithmetic mean of the clients' full-data gradients plus ``λ∇L_Fishr`` — i.e. FedSGD +
  Fishr, the same update as ``fishr_intra_arith`` (whose official version averages the
  client's mini-batch gradients, equal to the full gradient when the mini-batches have
  equal sizes). Shoham et al.'s Fisher penalty is ``fedcurv_shoham``.

  Args:
    fishr_lambda, fishr_reduction: see ``fishr_component`` (15.0 on the ``'sum'`` scale:
      FedILC §5.1.1).
    server_optimizer, server_lr, weight_decay, b1, b2, eps, batch_size, weighting: as
      ``geometric``.

  Returns:
    ``Algorithm`` named ``'fedcurv'`` (``hparams`` records every value).

  Raises:
    ValueError: as ``fishr_intra_arith``.

  Source: FedILC §5 (baselines); official code ``main.py --algorithm=fishr``.
  """
  _check_unknown("fedcurv", unknown, _COMMON + ("fishr_lambda", "fishr_reduction"))
  return _fedsgd_type(
      "fedcurv", aggregator=aggs.weighted_mean(),
      components=(fishr_component(fishr_lambda, fishr_reduction),), batch_size=batch_size,
      weighting=weighting, server=(server_optimizer, server_lr, weight_decay, b1, b2, eps),
      extra_hp=dict(fishr_lambda=float(fishr_lambda), fishr_reduction=fishr_reduction))


FEDILC_METHODS = ("geometric", "fishr_inter_geo", "fishr_intra_geo", "fishr_intra_arith",
                  "fedcurv")
_FISHR_METHODS = ("fishr_inter_geo", "fishr_intra_geo", "fishr_intra_arith", "fedcurv")


def fedilc_task_settings(*, server_lr: float, weight_decay: float, fishr_lambda: float,
                         group_size: int) -> dict:
  """A task's ``defaults['per_algorithm']`` block for the FedILC methods (FedILC §5.1).

  The FedILC methods are FedSGD-type (registered with ``fixed=FEDSGD_FIXED``), so a
  task's client recipe (``client_lr``, ``weight_decay``, ...) is not passed to them; a
  task gives their *server* settings here. Every method gets the server Adam with coupled
  L2 (``server_optimizer='adam'``, the official ``torch.optim.Adam(lr, weight_decay)``),
  ``server_lr``, ``weight_decay`` and ``batch_size=None`` (clients send full-data
  gradients, whatever the task's minibatch size); the Fishr methods get
  ``fishr_lambda`` (on the official ``'sum'`` scale); Intra-Geo gets
  ``intra_group_size = group_size`` (the official DataLoader batch).

  Args:
    server_lr: server learning rate (> 0): 3e-4 Color-MNIST, 1e-4 Rotated-CIFAR10, 2e-4
      eICU.
    weight_decay: coupled L2 (>= 0): 0.01, 1e-3, 1e-3.
    fishr_lambda: λ (>= 0): 15.0, 1.0, 0.1.
    group_size: Intra-Geo mini-batch size (positive int): 32, 64, 64.

  Returns:
    ``{name: {setting: value}}`` for ``FEDILC_METHODS``.

  Raises:
    ValueError: a bad value (named), from the same checks as the factories.

  Source: FedILC §5.1.1-5.1.3; official code ``main.py`` commands.
  """
  _server_opt("adam", server_lr, weight_decay)
  _nonneg("fishr_lambda", fishr_lambda)
  _pos_int("group_size", group_size)
  server = dict(server_optimizer="adam", server_lr=float(server_lr),
                weight_decay=float(weight_decay), batch_size=None)
  out = {name: dict(server) for name in FEDILC_METHODS}
  for name in _FISHR_METHODS:
    out[name]["fishr_lambda"] = float(fishr_lambda)
  out["fishr_intra_geo"]["intra_group_size"] = int(group_size)
  return out
