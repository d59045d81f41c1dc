"""FedILC's FedSGD-type recipe and server optimizer, shared by its five methods
(``fedilc.py``: geometric, fishr_inter_geo, fishr_intra_geo, fishr_intra_arith, fedcurv)
and Shoham's FedCurv (``fedcurv.py``). Readings: docs/ALGORITHMS.md#fedilc."""
from __future__ import annotations

import optax

from fedjax_inv.aggregation import aggregators as aggs
from fedjax_inv.algorithms.base import FEDSGD_CLIENT_RECIPE
from fedjax_inv.core.algorithm import WEIGHTINGS, Algorithm, learning_rate_in_round
from fedjax_inv.core.validation import choice as _choice, finite as _finite, nonneg as _nonneg
from fedjax_inv.core.validation import pos_int as _pos_int, positive as _positive

# Not the registry's server optimizers (algorithms/schema.py): this family's own update rules.
FEDSGD_SERVER_OPTIMIZERS = ("adamw", "adam", "sgd")
# FedILC §5.1.1 Color-MNIST server settings (official torch.optim.Adam(lr, weight_decay)).
SERVER_DEFAULTS = dict(server_optimizer="adam", server_lr=3e-4, weight_decay=0.01, b1=0.9,
                       b2=0.999, eps=1e-8)
COMMON = ("batch_size", "weighting", "client_optimizer_state") + tuple(SERVER_DEFAULTS)


def check_unknown(name: str, unknown: dict, accepted) -> None:
  """Raises ValueError naming ``unknown`` keywords (and why, for FedSGD's fixed ones)."""
  if not unknown:
    return
  fixed = sorted(k for k in unknown if k in FEDSGD_CLIENT_RECIPE)
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
  _choice("server_optimizer", name, FEDSGD_SERVER_OPTIMIZERS)
  lr = _positive("server_lr", lr)
  wd = _nonneg("weight_decay", weight_decay)
  for nm, b in (("b1", b1), ("b2", b2)):
    b = _finite(nm, b, "use a number in [0, 1)")
    if not 0.0 <= b < 1.0:
      raise ValueError(f"{nm}={b!r}; Adam's moment decay must be in [0, 1).")
  eps = _positive("eps", eps)

  def make(rate):
    if name == "adamw":
      return optax.adamw(rate, b1=b1, b2=b2, eps=eps, weight_decay=wd)
    inner = optax.adam(rate, b1=b1, b2=b2, eps=eps) if name == "adam" else optax.sgd(rate)
    return optax.chain(optax.add_decayed_weights(wd), inner) if wd else inner

  return learning_rate_in_round("server_lr", make, lr)


def server_settings(name: str, kw: dict, own: tuple = ()) -> tuple:
  """Pops the server knobs (:data:`SERVER_DEFAULTS`) from ``kw`` and refuses anything left
  that is not in ``own`` (the factory's own keywords).

  Returns:
    ``(optax server optimizer, hparams dict of the server settings)``.

  Raises:
    ValueError: unknown keyword (or one FedSGD fixes), or a bad server value.
  """
  s = {k: kw.pop(k, v) for k, v in SERVER_DEFAULTS.items()}
  check_unknown(name, {k: v for k, v in kw.items() if k not in own},
                COMMON + tuple(own))
  opt = server_optimizer(s["server_optimizer"], s["server_lr"], s["weight_decay"], s["b1"],
                         s["b2"], s["eps"])
  hp = dict(server_optimizer=s["server_optimizer"], server_lr=float(s["server_lr"]),
            weight_decay=float(s["weight_decay"]))
  if s["server_optimizer"] in ("adamw", "adam"):
    hp.update(b1=float(s["b1"]), b2=float(s["b2"]), eps=float(s["eps"]))
  return opt, hp


def fedsgd_type(name: str, kw: dict, *, aggregator: aggs.Aggregator, components: tuple = (),
                extra_hp: dict | None = None) -> Algorithm:
  """A FedSGD-type FedILC method: one local ``sgd(1.0)`` step per round on ``batch_size``
  examples (None: the client's full data), so the pseudo-gradient is the client gradient;
  ``aggregator`` over clients, the ``components``, FedILC's server optimizer.

  Args:
    name: registry name.
    kw: the remaining keywords of the factory: ``batch_size``, ``weighting``,
      ``client_optimizer_state`` ('restart' default | 'persistent'; the one ``sgd(1.0)``
      step keeps no state, so both run the same numbers) and the server knobs
      (:data:`SERVER_DEFAULTS`); anything else is refused.
    aggregator, components: the method's.
    extra_hp: the factory's own hyperparameters, recorded in ``hparams``.

  Raises:
    ValueError: a bad or unknown keyword (named, with the fix).

  Source: FedILC §5 (FedSGD-type methods), §5.1 (server Adam with coupled L2).
  """
  kw, extra_hp = dict(kw), dict(extra_hp or {})
  batch_size = _pos_int("batch_size", kw.pop("batch_size", None), allow_none=True,
                        none_means="the full client data")
  weighting = kw.pop("weighting", "num_examples")
  client_state = kw.pop("client_optimizer_state", "restart")
  opt, hp = server_settings(name, kw)
  _choice("weighting", weighting, WEIGHTINGS)
  hp = dict(client_optimizer="sgd", client_lr=1.0, local_steps=1, batch_size=batch_size,
            weighting=weighting, aggregator=aggregator.name, **hp, **extra_hp,
            client_optimizer_state=client_state)
  return Algorithm(name=name, client_optimizer=optax.sgd(1.0), server_optimizer=opt,
                   local_steps=1, batch_size=batch_size, aggregator=aggregator,
                   weighting=weighting, components=tuple(components),
                   hparams=hp, client_optimizer_state=client_state)
