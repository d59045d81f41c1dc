"""The FedILC family (Zhu, Ezzine, Liu, Bengio): FedSGD-type methods (one ``sgd(1.0)``
step per round, so clients send gradients) that differ in how gradients are combined and
whether ``λ∇L_Fishr`` is added before the server optimizer (Adam with coupled L2, FedILC
§5.1; ``fedsgd_type.py``). Shoham's FedCurv is in ``fedcurv.py``; the methods' settings on
FedILC's tasks in ``tasks/fedilc_settings.py``. The readings (Fishr's message protocol,
zeros, the scalable Intra-Geo, task settings): docs/ALGORITHMS.md#fedilc.
"""
from __future__ import annotations

from fedjax_inv.aggregation import aggregators as aggs
from fedjax_inv.algorithms.base import FEDSGD_FIXED, register
from fedjax_inv.algorithms.fedsgd_type import fedsgd_type
from fedjax_inv.algorithms.fishr import fishr_component
from fedjax_inv.algorithms.intra_geo import ZEROS, intra_geo_component
from fedjax_inv.core.algorithm import Algorithm
from fedjax_inv.core.validation import choice as _choice


@register("geometric", paper="FedILC §3.1, §5 (Geometric baseline)",
          summary="FedSGD with the weighted geometric mean of client gradients, server Adam",
          fixed=FEDSGD_FIXED)
def geometric(*, zeros: str = "negative", **kw) -> Algorithm:
  """Geometric: ``w ← server_opt(w, wgm_e(g_e))``, ``g_e`` client ``e``'s gradient at ``w``.

  ``wgm(G) = |E+|/|E|·(Π_{E+}|g|)^{1/|E+|} − |E−|/|E|·(Π_{E−}|g|)^{1/|E−|}`` per
  coordinate, every sampled client counted once (``weighting`` only weights the reported
  train loss).

  Args:
    zeros: 'negative' (default: the official code, ``sign > 0`` is E+) or 'both' (the
      §3.1 text: a zero in both sets zeroes that coordinate); see
      ``aggregators.weighted_geometric_mean``.
    **kw: ``batch_size`` (None: full client data), ``weighting``, ``server_optimizer``,
      ``server_lr``, ``weight_decay``, ``b1``, ``b2``, ``eps`` (``fedsgd_type``;
      defaults FedILC §5.1.1 Color-MNIST: adam, 3e-4, 0.01).

  Raises:
    ValueError: any bad value (named, with the fix); ``client_lr`` / ``local_steps`` /
      ``client_optimizer`` (fixed by FedSGD) or any unknown keyword.

  Source: FedILC §3.1 (weightedgeo, ``w ← w − η∇^∧F``), §5 (Geometric baseline).
  """
  _choice("zeros", zeros, ZEROS)
  return fedsgd_type("geometric", kw, aggregator=aggs.geometric_mean_aggregator(zeros),
                     extra_hp=dict(zeros=zeros))


def _fishr(lam, reduction):
  return (fishr_component(lam, reduction),
          dict(fishr_lambda=float(lam), fishr_reduction=reduction))


@register("fishr_inter_geo", paper="FedILC §3.2, Alg. 1 (Fishr+Inter-Geo)",
          summary="weighted geometric mean of client gradients + lambda * grad Fishr "
                  "(VJP protocol), server Adam",
          fixed=FEDSGD_FIXED)
def fishr_inter_geo(*, fishr_lambda: float = 15.0, fishr_reduction: str = "sum",
                    zeros: str = "negative", **kw) -> Algorithm:
  """Fishr+Inter-Geo: ``w ← server_opt(w, ∇^∧F + λ∇L_Fishr)`` (FedILC Alg. 1).

  ``∇^∧F`` as ``geometric``; ``L_Fishr`` over the sampled clients' diagonal per-example
  gradient variances of the final linear classifier at ``w``, its gradient w.r.t. all
  parameters by ``fishr_component``'s message protocol. ``fishr_lambda=0`` is
  ``geometric`` exactly.

  Args:
    fishr_lambda: ``λ >= 0`` (FedILC §5.1.1: 15.0 for Color-MNIST).
    fishr_reduction: ``'sum'`` (default, the official code's scale of λ) or ``'mean'``
      (Alg. 1's ``1/E``).
    zeros, **kw: as ``geometric``.

  Raises:
    ValueError: as ``geometric``; ``fishr_lambda`` negative or not finite.

  Source: FedILC §3.2, Alg. 1.
  """
  _choice("zeros", zeros, ZEROS)
  comp, hp = _fishr(fishr_lambda, fishr_reduction)
  return fedsgd_type("fishr_inter_geo", kw, aggregator=aggs.geometric_mean_aggregator(zeros),
                     components=(comp,), extra_hp=dict(zeros=zeros, **hp))


@register("fishr_intra_geo", paper="FedILC §3.3, Alg. 2 (Fishr+Intra-Geo)",
          summary="client gradient = weighted geometric mean of per-example (or "
                  "mini-batch) gradients, arithmetic mean across clients + lambda * grad "
                  "Fishr, server Adam",
          fixed=FEDSGD_FIXED)
def fishr_intra_geo(*, fishr_lambda: float = 15.0, fishr_reduction: str = "sum",
                    intra_group_size=32, intra_shuffle: bool = True, intra_groups=None,
                    intra_chunk: int = 64, zeros: str = "negative", **kw) -> Algorithm:
  """Fishr+Intra-Geo: ``w ← server_opt(w, mean_e ∇^∧F_e + λ∇L_Fishr)`` (FedILC Alg. 2).

  Client ``e`` sends ``∇^∧F_e``, the weighted geometric mean of the gradients of its
  mini-batches of ``intra_group_size`` examples (default 32, reshuffled every round, zeros
  counted as negative: FedILC §5's "scalable solution" as the official code runs it);
  ``intra_group_size=None`` is Alg. 2 literally (each example an environment) or, with
  ``intra_groups=m``, ``m`` contiguous groups (``intra_geo_component``). The server takes
  their arithmetic mean (``weighting``) and adds ``λ∇L_Fishr``.

  Args:
    fishr_lambda, fishr_reduction: as ``fishr_inter_geo``.
    intra_group_size: examples per group (32: official Color-MNIST batch; 64 Rotated-
      CIFAR10 / eICU), or None.
    intra_shuffle: reshuffle the examples into groups every round (default True).
    intra_groups: with ``intra_group_size=None``: None (per example) or ``m >= 1``.
    intra_chunk: examples per vectorized chunk of per-example gradients (memory only).
    zeros, **kw: as ``geometric``.

  Raises:
    ValueError: as ``geometric``; a bad ``fishr_*`` or ``intra_*`` value.

  Source: FedILC §3.3, Alg. 2; §5 (mini-batch geometric mean).
  """
  comp = intra_geo_component(intra_groups, intra_chunk, zeros, intra_group_size,
                             intra_shuffle)
  fishr, hp = _fishr(fishr_lambda, fishr_reduction)
  return fedsgd_type("fishr_intra_geo", kw, aggregator=aggs.weighted_mean(),
                     components=(comp, fishr), extra_hp=dict(
                         zeros=zeros, intra_group_size=intra_group_size,
                         intra_shuffle=intra_shuffle, intra_groups=intra_groups,
                         intra_chunk=int(intra_chunk), **hp))


def _arith(name, paper, summary, doc):
  def factory(*, fishr_lambda: float = 15.0, fishr_reduction: str = "sum", **kw):
    comp, hp = _fishr(fishr_lambda, fishr_reduction)
    return fedsgd_type(name, kw, aggregator=aggs.weighted_mean(), components=(comp,),
                       extra_hp=hp)
  factory.__name__, factory.__doc__ = name, doc
  return register(name, paper=paper, summary=summary, fixed=FEDSGD_FIXED)(factory)


_ARITH_DOC = """{title}: ``w ← server_opt(w, Σ_e n_e g_e / Σ n_e + λ∇L_Fishr)``.

  {what} Args: ``fishr_lambda``, ``fishr_reduction`` as ``fishr_inter_geo``; ``**kw`` as
  ``geometric``. Raises ValueError as ``fishr_inter_geo``. Source: {source}.
  """
fishr_intra_arith = _arith(
    "fishr_intra_arith", "FedILC §5 (Fishr+Intra-Arith baseline)",
    "FedSGD (arithmetic mean of client gradients) + lambda * grad Fishr, server Adam",
    _ARITH_DOC.format(title="Fishr+Intra-Arith", what="FedSGD (client gradients averaged "
                      "by size) plus the Fishr term; ``fishr_lambda=0`` is FedSGD with "
                      "FedILC's server.", source="FedILC §5, Alg. 2 with arithmetic means"))
fedcurv = _arith(
    "fedcurv", "FedILC §5 (FedCurv baseline = FedSGD + Fishr, official README)",
    "FedILC's FedCurv: FedSGD (arithmetic mean of full-client gradients) + lambda * grad "
    "Fishr, server Adam",
    _ARITH_DOC.format(title="FedCurv as FedILC's tables run it", what="The official "
                      '``--algorithm=fishr`` (README: "FedCurv"): the same update as '
                      "``fishr_intra_arith``; Shoham et al.'s penalty is "
                      "``fedcurv_shoham``.", source="FedILC §5; official main.py"))
