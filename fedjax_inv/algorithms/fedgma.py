"""FedGMA (Tenison et al. 2022, gradient masked averaging) and the AND-mask, on any base.

Both wrap a registered base algorithm (FedAvg, FedSGD, FedProx, SCAFFOLD, FedAvgM,
FedAdagrad, FedAdam, FedYogi, ... — FedGMA Alg. 1 and App. A.2) and change only the server
step. From the round's client pseudo-gradients ``Δ_k = w_t − w_k`` the server computes the
sign agreement per coordinate (FedGMA §4)::

    A = |(1/C) Σ_k sign(Δ_k)|          (unweighted over the C sampled clients)
    fedgma:   m = 1 if A >= τ else A   (soft mask m̃_τ, values in [0, 1])
    and_mask: m = 1 if A >= τ else 0   (binary mask m_τ; Parascandolo et al. 2021)

and the update ``w_{t+1} = w_t − η_g · m ⊙ Δ_t``. The absolute value in ``A`` is not
printed in FedGMA's formulas (without it, unanimous negative updates would be masked out),
but it is what the AND-mask means (agreement on either direction); see
``aggregators.agreement_mask`` (the one mask implementation, shared with
``aggregator='gma'|'and_mask'``). The rule is ``1 if A >= τ else A`` — not ``m·(1 + A)``, an
operator-precedence bug of a public port (DESIGN.md §6).

Where the mask goes (``mask_at``):
  * ``'update'`` (default, FedGMA Alg. 1 line 14): ``Δ_t`` there is the *server
    optimizer's output*: for FedAdam/FedYogi the moments ``m_t, v_t`` are updated with the
    unmasked mean pseudo-gradient (lines 8-11) and the mask multiplies the final step
    ``η_g m_t / (√v_t + ε)``. Implemented as: the aggregator returns
    ``MaskedPseudoGradient(pseudo_grad, mask)`` and the wrapped server optimizer applies
    ``mask ⊙ base_server_optimizer(pseudo_grad)``. For SGD servers (FedAvg, FedProx,
    SCAFFOLD, FedSGD) this is the same as masking the pseudo-gradient; for FedAvgM the
    momentum buffer sees the unmasked pseudo-gradient as for FedAdam. SCAFFOLD's control
    variates are updated unmasked (the paper's App. A.2 is not available here).
  * ``'pseudo_gradient'``: ``mask ⊙ mean_k Δ_k`` is what the server optimizer sees (what
    ``make_algorithm(base, aggregator='gma', tau=τ)`` does).

Server learning rate: Alg. 1 scales the masked step by the base's server learning rate
``η_g`` (``server_lr``; 1.0 for FedAvg-family bases by default, so FedGMA with τ = 0 is
exactly the base). FedGMA §3's ``η_g = K η_l`` refers to pseudo-gradients written as sums
of raw gradients; ours already include the client learning rate, so ``η_g = 1`` matches.

Defaults: ``tau=0.4`` for both (FedGMA's main text gives no value; 0.4 is ``base.build``'s
default and a public port's ``masking_threshold``; DomainBed's ANDMask default is 1.0 with
search range [0.5, 1]). The AND-mask's optional ``rescale`` (Parascandolo et al.'s code /
DomainBed: divide each masked parameter tensor by ``1e-10 + mask density``) is off by
default, as in FedGMA §4's binary-mask update.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

# The mask itself (one implementation) lives in aggregators; re-exported for this module's
# users (tests, notebooks): agreement_mask, masking_aggregator, MaskedPseudoGradient.
from fedjax_inv.aggregators import (MASK_RULES as RULES, MaskedPseudoGradient,  # noqa: F401
                                    agreement_mask, check_tau, masking_aggregator)
from fedjax_inv.algorithms.base import make_algorithm, register, registry
from fedjax_inv.core.algorithm import Algorithm

PyTree = Any
MASK_AT = ("update", "pseudo_gradient")
_SELF = ("fedgma", "and_mask")


def masked_server_optimizer(inner: optax.GradientTransformation
                            ) -> optax.GradientTransformation:
  """Server optimizer of FedGMA Alg. 1: ``update = mask ⊙ inner(Δ_t)``.

  Takes a ``MaskedPseudoGradient``; ``inner`` (sgd, momentum, Reddi's adagrad/adam/yogi)
  sees the unmasked ``Δ_t`` and its state evolves exactly as in the base algorithm;
  only the returned step is masked. State and params: those of ``inner``.

  Raises:
    TypeError (at trace time): the input is not a ``MaskedPseudoGradient``.

  Source: FedGMA Alg. 1 lines 7-14.
  """
  def update(masked, state, params=None):
    if not isinstance(masked, MaskedPseudoGradient):
      raise TypeError("masked_server_optimizer needs the MaskedPseudoGradient produced "
                      f"by masking_aggregator(carry_mask=True), got {type(masked)}.")
    updates, state = inner.update(masked.pseudo_grad, state, params)
    return jax.tree.map(jnp.multiply, updates, masked.mask), state

  return optax.GradientTransformation(inner.init, update)


def _unwrap_server_update(fn):
  """Lets a base component's ``server_update`` see (and return) a plain pseudo-gradient."""
  def server_update(state, aggregate, carried, ctx):
    state, pg = fn(state, aggregate, carried.pseudo_grad, ctx)
    return state, carried._replace(pseudo_grad=pg)
  return server_update


def mask_algorithm(alg: Algorithm, name: str, tau: float, rule: str = "gma",
                   mask_at: str = "update", rescale: bool = False) -> Algorithm:
  """Plugs the sign-agreement mask into an existing ``Algorithm`` (see module docstring).

  Keeps the base's clients, components, weighting and server optimizer; replaces the
  aggregator by :func:`masking_aggregator` around the base's aggregator and, with
  ``mask_at='update'``, the server optimizer by :func:`masked_server_optimizer`.

  Raises:
    ValueError: ``mask_at`` unknown; bad ``tau`` / ``rule`` / ``rescale``; the base
      already masks (its aggregator is 'gma' or 'and_mask').

  Source: FedGMA Alg. 1 (FedAvg, FedProx, FedAdam, FedYogi), App. A.2 (SCAFFOLD).
  """
  if mask_at not in MASK_AT:
    raise ValueError(f"mask_at={mask_at!r}; choose one of {MASK_AT}.")
  if alg.aggregator.name.startswith(("gma", "and_mask")):
    raise ValueError(f"base algorithm {alg.name!r} already masks its aggregate "
                     f"({alg.aggregator.name}); use its plain aggregator.")
  carry = mask_at == "update"
  agg = masking_aggregator(alg.aggregator, tau, rule, rescale, carry_mask=carry)
  comps = alg.components
  server_opt = alg.server_optimizer
  if carry:
    comps = tuple(dataclasses.replace(c, server_update=_unwrap_server_update(
        c.server_update)) if c.server_update is not None else c for c in comps)
    server_opt = masked_server_optimizer(server_opt)
  hp = dict(alg.hparams, base=alg.name, tau=float(tau), mask_at=mask_at)
  if rule == "and_mask":
    hp["rescale"] = bool(rescale)
  return alg.replace(name=name, aggregator=agg, components=comps,
                     server_optimizer=server_opt, hparams=hp)


def _masked(name, rule, base, tau, mask_at, rescale, kw):
  if not isinstance(base, str) or base in _SELF or base not in registry():
    avail = sorted(set(registry()) - set(_SELF))
    raise ValueError(f"{name}: unknown base={base!r}; choose a registered algorithm: "
                     f"{avail}.")
  check_tau(tau)
  if mask_at not in MASK_AT:
    raise ValueError(f"mask_at={mask_at!r}; choose one of {MASK_AT}.")
  if not isinstance(rescale, bool):
    raise ValueError(f"rescale={rescale!r}; pass True or False.")
  if kw.get("aggregator") in ("gma", "and_mask"):
    raise ValueError(f"{name} already applies its mask; drop aggregator="
                     f"{kw['aggregator']!r} (or use make_algorithm({base!r}, "
                     f"aggregator={kw['aggregator']!r}) without {name}).")
  return mask_algorithm(make_algorithm(base, **kw), name, tau, rule, mask_at, rescale)


@register("fedgma", paper="FedGMA (Tenison et al. 2022), §4, Alg. 1",
          summary="soft sign-agreement mask (1 if A>=tau else A) on the server step of "
                  "any base (fedavg, fedprox, scaffold, fedadam, fedyogi, ...)")
def fedgma(base: str = "fedavg", tau: float = 0.4, mask_at: str = "update", **kw):
  """FedGMA: gradient-masked ``base`` (default FedAvg).

  Args:
    base: registered base algorithm name ('fedavg', 'fedsgd', 'fedprox', 'scaffold',
      'fedavgm', 'fedadagrad', 'fedadam', 'fedyogi', or any other registered one).
    tau: agreement threshold in [0, 1]; ``tau=0`` is exactly the base.
    mask_at: 'update' (FedGMA Alg. 1: mask the server optimizer's step) or
      'pseudo_gradient' (mask the mean pseudo-gradient before the server optimizer).
    **kw: the base's hyperparameters (client_lr, server_lr, mu, ...).

  Raises:
    ValueError: unknown base (lists the registered ones); tau outside [0, 1]; bad
      mask_at; ``aggregator='gma'|'and_mask'`` in kw; any error of the base factory.
  """
  return _masked("fedgma", "gma", base, tau, mask_at, False, kw)


@register("and_mask", paper="Parascandolo et al. 2021 (AND-mask); FedGMA §4 (m_tau)",
          summary="binary sign-agreement mask (1 if A>=tau else 0) on the server step "
                  "of any base")
def and_mask(base: str = "fedavg", tau: float = 0.4, mask_at: str = "update",
             rescale: bool = False, **kw):
  """AND-mask on the server step of ``base``: coordinates whose client updates agree in
  sign less than ``tau`` are not updated this round.

  Args:
    base, tau, mask_at, **kw: as in :func:`fedgma`.
    rescale: divide each masked parameter tensor by ``1e-10 + mask density``
      (Parascandolo et al.'s code; off by default, as in FedGMA §4).

  Raises:
    ValueError: as in :func:`fedgma`; ``rescale`` not a bool.
  """
  return _masked("and_mask", "and_mask", base, tau, mask_at, rescale, kw)
