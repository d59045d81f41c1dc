"""FedGMA (Tenison et al. 2022, §4, Alg. 1) and the AND-mask (Parascandolo et al. 2021) on
any registered base: each client also sends ``Δ_k`` to a sign-agreement reduction
(``A = |mean_k sign(Δ_k)|``) and a mask stage joins the base's server chain: after its
optimizer (``mask_at='update'``, Alg. 1 l. 14) or before it (``'pseudo_gradient'``); the
choices (|·|, τ = 0.4, rescale, η_g) are in docs/ALGORITHMS.md#fedgma."""
import jax
import jax.numpy as jnp
import optax

from fedjax_inv.aggregation.aggregators import mask_step, sign_agreement
from fedjax_inv.algorithms.base import make_algorithm, register, registry
from fedjax_inv.core.algorithm import Component, optimizer_traced, reading


def masked(name, rule, base, tau, mask_at, rescale, kw):
  """``base`` (a registered name; ``kw``: its hyperparameters) with the ``rule`` mask ('gma' |
  'and_mask'). ValueError: unknown base, τ ∉ [0, 1], bad mask_at/rescale, aggregator=gma."""
  why = ("unknown base" if base in ("fedgma", "and_mask") or base not in registry() else
         "bad mask_at" if mask_at not in ("update", "pseudo_gradient") else
         "it already applies its mask" if kw.get("aggregator") in ("gma", "and_mask") else "")
  if why:
    raise ValueError(f"{name}: {why}: base={base!r} (registered: {sorted(registry())}), mask_at"
                     f"={mask_at!r} ('update' | 'pseudo_gradient'), "
                     f"aggregator={kw.get('aggregator')!r}.")
  alg, mask = make_algorithm(base, **kw), mask_step(tau, rule, rescale)  # the server stage
  sign = Component("sign", aggregator=sign_agreement(), traced=("tau",), message=lambda
                   params, ctx: jax.tree.map(jnp.subtract, ctx.params, params))
  chain = (alg.server_optimizer, mask) if mask_at == "update" else (mask, alg.server_optimizer)
  hp = dict(alg.hparams, base=base, tau=float(tau), mask_at=mask_at,
            **({"rescale": rescale} if rule == "and_mask" else {}))
  return alg.replace(name=name, components=alg.components + (sign,), hparams=hp,
                     server_optimizer=reading(optax.chain(*chain),
                                              optimizer_traced(alg.server_optimizer)))


register("fedgma", paper="FedGMA (Tenison et al. 2022), §4, Alg. 1", summary="soft sign-"
         "agreement mask (1 if A>=tau else A) on the server step of any base")(
    lambda base="fedavg", tau=0.4, mask_at="update", **kw: masked(  # noqa: E731
        "fedgma", "gma", base, tau, mask_at, False, kw))
register("and_mask", paper="Parascandolo et al. 2021 (AND-mask); FedGMA §4 (m_tau)",
         summary="binary sign-agreement mask (1 if A>=tau else 0) on the server step")(
    lambda base="fedavg", tau=0.4, mask_at="update", rescale=False, **kw: masked(
        "and_mask", "and_mask", base, tau, mask_at, rescale, kw))
