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

from typing import Any

import optax

from fedjax_inv import aggregators as aggs
from fedjax_inv.algorithms import base
from fedjax_inv.algorithms.base import FEDSGD_FIXED, register
# The components live in one module each (fishr.py, intra_geo.py, fedcurv.py); re-exported
# here, the module of FedILC's methods.
from fedjax_inv.algorithms.fedcurv import (diagonal_fisher, fedcurv_component,  # noqa: F401
                                           fedcurv_penalty)
from fedjax_inv.algorithms.fishr import (FISHR_REDUCTIONS, client_grad_variance,  # noqa: F401
                                         fishr_component)
from fedjax_inv.algorithms.intra_geo import ZEROS, intra_geo_component  # noqa: F401
from fedjax_inv.core.algorithm import Algorithm
from fedjax_inv.core.validation import choice as _choice, finite as _finite, nonneg as _nonneg
from fedjax_inv.core.validation import pos_int as _pos_int, positive as _positive

PyTree = Any

SERVER_OPTIMIZERS = ("adamw", "adam", "sgd")
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
