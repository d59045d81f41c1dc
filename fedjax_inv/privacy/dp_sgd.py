"""Sample-level differential privacy on the client: DP-SGD (Abadi et al. 2016, "Deep
Learning with Differential Privacy", Alg. 1) as the local steps of any algorithm whose
client objective is the task loss, a sum over examples.

Each local step of each client, inside the jitted round (the per-example gradients are
a ``jax.vmap`` over the step's examples, the client axis around it as usual):

    per example:  g_i = ∇ℓ(w; x_i, y_i)
    clip:         ḡ_i = g_i · min(1, C / ‖g_i‖)       (‖·‖ the L2 norm over every parameter)
    noise:        g̃ = (Σ_i ḡ_i + N(0, σ² C² I)) / B   (B the batch size, fixed)

then the client's optimizer step on ``g̃``. This protects each *example* of a client
against everything the client sends (its update), the "local DP" of Flower's
``LocalDpMod`` family and Opacus' DP-SGD; it composes with client-level DP-FedAvg
(``fedjax_inv.privacy.client_dp``), which protects whole clients at the server.

Batches. An example must enter a step at most once, or its gradient counts twice
(sensitivity 2C). The engine's default minibatches are drawn with replacement, so DP-SGD
needs ``local_epochs`` (each epoch a fresh permutation of the client's rows, in batches
of ``B``) or the whole client every step (``batch_size=None``, then ``B = n_i``).

Accounting (``dp-accounting``, RDP, add-or-remove-one): for a client with ``n`` examples,
each step is a sampled Gaussian mechanism at ``q = B/n`` (``q = 1`` for the whole
client), composed over ``steps × rounds`` steps: every round the client could be sampled
in, so client sampling gives no amplification here (conservative). The reported ε is the
largest over the pool's client sizes. Shuffled batches are accounted as Poisson sampling,
the approximation TF Privacy and Opacus users make; Chua et al. 2024 ("How Private are
DP-SGD Implementations?") show that shuffling can leak more than that ε. The whole-client
mode (q = 1) has no such gap. Client sizes are treated as public.

Source: Abadi et al. 2016, Alg. 1 (per-example clipping, Gaussian noise on the sum,
division by the lot size); Mironov et al. 2019 (RDP of the sampled Gaussian).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_inv.core.algorithm import Batch, Component

NAME = "dp_sgd"


@dataclasses.dataclass(frozen=True)
class DPSGDSettings:
  """Sample-level DP-SGD of a run (module docstring).

  Attributes:
    clip: ``C`` > 0, the L2 bound of every per-example gradient (``math.inf``: no
      clipping, only with ``noise_multiplier == 0``).
    noise_multiplier: ``σ >= 0``: the noise std on the sum of clipped gradients is ``σC``.
    delta: ``δ`` in (0, 1), per example.
  """
  clip: float
  noise_multiplier: float
  delta: float = 1e-5

  def check(self) -> "DPSGDSettings":
    """Raises ValueError naming the bad value (as the CLI flag) and the fix."""
    from fedjax_inv.privacy.client_dp import is_number as number
    if not number(self.clip) or self.clip <= 0:
      raise ValueError(f"--dp-sgd-clip {self.clip!r}: the per-example clipping norm C must "
                       "be > 0 (e.g. 1.0).")
    if not number(self.noise_multiplier) or not 0 <= self.noise_multiplier < math.inf:
      raise ValueError(f"--dp-sgd-noise-multiplier {self.noise_multiplier!r}: sigma must be "
                       "a finite number >= 0.")
    if math.isinf(self.clip) and self.noise_multiplier > 0:
      raise ValueError(f"--dp-sgd-clip inf with --dp-sgd-noise-multiplier "
                       f"{self.noise_multiplier}: the noise sigma*C would be infinite; give "
                       "a finite clip.")
    if not number(self.delta) or not 0 < self.delta < 1:
      raise ValueError(f"--dp-sgd-delta {self.delta!r}: delta must be in (0, 1), e.g. 1e-5.")
    return self


def clip_and_noise(grads, weights, clip: float, noise_multiplier: float, denominator, key):
  """DP-SGD's privatized gradient from per-example gradients.

  Args:
    grads: pytree of per-example gradients, each leaf ``[B, ...]``.
    weights: ``[B]`` 0/1 weights (padding rows of a partial batch weigh 0).
    clip: ``C`` (``math.inf``: no clipping).
    noise_multiplier: ``σ``.
    denominator: the divisor (the batch size ``B``, a float32 scalar).
    key: PRNG key of the noise.

  Returns:
    ``(Σ_i w_i g_i min(1, C/‖g_i‖) + N(0, σ²C² I)) / denominator``, shaped like one
    example's gradient.

  Source: Abadi et al. 2016, Alg. 1 lines "clip gradient" and "add noise".
  """
  leaves, tree = jax.tree.flatten(grads)
  sq = sum(jnp.sum(jnp.square(g).reshape(g.shape[0], -1), axis=1) for g in leaves)
  norm = jnp.sqrt(sq)
  factor = (jnp.ones_like(norm) if math.isinf(clip)
            else jnp.minimum(1.0, clip / jnp.maximum(norm, 1e-30)))
  scale = factor * weights
  summed = [jnp.tensordot(scale, g, axes=1) for g in leaves]
  if noise_multiplier > 0:
    keys = jax.random.split(key, len(leaves))
    summed = [s + noise_multiplier * clip * jax.random.normal(k, s.shape, s.dtype)
              for s, k in zip(summed, keys)]
  return jax.tree.unflatten(tree, [s / denominator for s in summed])


def dp_sgd_component(clip: float, noise_multiplier: float,
                     batch_size: Optional[int]) -> Component:
  """DP-SGD as the client's gradient estimator (a :class:`Component` named ``'dp_sgd'``).

  Args:
    clip: ``C`` (:class:`DPSGDSettings`).
    noise_multiplier: ``σ``.
    batch_size: the algorithm's ``B`` (the fixed divisor), or None for the whole client
      (the divisor is then its number of real rows, ``Σ w``).

  Returns:
    the component; its ``grad_estimator(objective, params, batch, key)`` returns the
    mean per-example loss of the step (a statistic, not privatized) and
    :func:`clip_and_noise` of the step's per-example gradients (``batch.x: [B, ...]``).
  """
  def estimate(objective, params, batch, key):
    k_loss, k_noise = jax.random.split(key)

    def one(x, y):  # one example: the task loss on a batch of one
      return objective(params, Batch(x=x[None], y=y[None], w=jnp.ones((1,), jnp.float32)),
                       k_loss)
    losses, grads = jax.vmap(one)(batch.x, batch.y)
    w = batch.w.astype(jnp.float32)
    denom = jnp.float32(batch_size) if batch_size is not None else jnp.sum(w)
    g = clip_and_noise(grads, w, clip, noise_multiplier, denom, k_noise)
    return jnp.sum(w * losses) / jnp.maximum(jnp.sum(w), 1.0), g

  return Component(name=NAME, grad_estimator=estimate)


def apply(algorithm, settings: DPSGDSettings):
  """``algorithm`` whose local steps are DP-SGD steps (module docstring).

  Raises:
    ValueError: DP-SGD applied twice; a client objective that is not the task loss alone
      (a component adds a batch-level term, e.g. IRMv1's penalty: per-example clipping
      would change it); another component replacing the gradient estimator (FedILC's
      Intra-Geo); minibatches drawn with replacement (no ``local_epochs`` and a
      ``batch_size``). Each message names the algorithm and the fix.
  """
  settings.check()
  name = algorithm.name
  if any(c.name == NAME for c in algorithm.components):
    raise ValueError(f"{name}: DP-SGD is applied already (a component {NAME!r}).")
  if any(c.grad_estimator is not None for c in algorithm.components):
    raise ValueError(f"--dp-sgd-clip cannot cover {name!r}: it replaces how a step's "
                     "gradient is estimated (e.g. Intra-Geo's geometric mean), which "
                     "per-example clipping would change.")
  if not algorithm.task_only:
    extra = [c.name for c in algorithm.components if c.loss or c.forward or c.loss_scale]
    raise ValueError(f"--dp-sgd-clip cannot cover {name!r}: its client objective adds "
                     f"{extra} to the task loss, which is not a sum over examples, so "
                     "per-example clipping does not bound it; use an algorithm whose "
                     "client minimizes the task loss (fedavg, fedadam, scaffold, fedgma, "
                     "...).")
  if algorithm.batch_size is not None and algorithm.local_epochs is None:
    raise ValueError(f"--dp-sgd-clip with {name!r}: its minibatches are drawn with "
                     "replacement, so an example can enter a step twice (sensitivity 2C); "
                     "add --local-epochs E (shuffled batches) or use --batch-size full.")
  hp = dict(algorithm.hparams, dp_sgd_clip=settings.clip,
            dp_sgd_noise_multiplier=settings.noise_multiplier, dp_sgd_delta=settings.delta)
  return algorithm.replace(
      components=(dp_sgd_component(settings.clip, settings.noise_multiplier,
                                   algorithm.batch_size),) + algorithm.components,
      hparams=hp)


def client_epsilon(noise_multiplier: float, delta: float, n: int, batch_size, steps: int,
                   rounds: int) -> float:
  """ε at ``δ`` of one client's examples: ``steps × rounds`` sampled Gaussian steps at
  ``q = min(1, B/n)`` (``q = 1`` for ``batch_size=None``), RDP accountant,
  add-or-remove-one (``math.inf`` for ``σ = 0``)."""
  if noise_multiplier == 0:
    return math.inf
  from fedjax_inv.privacy.client_dp import _accountant, _dpa, quiet_epsilon
  dpa = _dpa()
  q = 1.0 if batch_size is None else min(1.0, batch_size / max(n, 1))
  gaussian = dpa.GaussianDpEvent(noise_multiplier)
  one = gaussian if q >= 1.0 else dpa.PoissonSampledDpEvent(q, gaussian)
  acc = _accountant("rdp", "poisson")  # RDP, add-or-remove-one
  acc.compose(dpa.SelfComposedDpEvent(one, int(steps) * int(rounds)))
  return quiet_epsilon(acc, delta)


def record(algorithm, client_sizes, rounds: int) -> Optional[dict]:
  """summary.json's ``privacy['sample_level']`` (None without DP-SGD): the largest ε over
  the pool's client sizes (module docstring), with the size that gives it.

  Args:
    algorithm: the run's algorithm (its ``hparams`` hold the DP-SGD settings).
    client_sizes: ``[N]`` real examples per pool client.
    rounds: the run's rounds.
  """
  hp = algorithm.hparams
  if "dp_sgd_clip" not in hp:
    return None
  sigma, delta, b = hp["dp_sgd_noise_multiplier"], hp["dp_sgd_delta"], algorithm.batch_size
  worst, at = -1.0, None
  for n in sorted({int(v) for v in np.asarray(client_sizes)}):
    steps = (algorithm.local_steps if algorithm.local_epochs is None
             else algorithm.local_epochs * math.ceil(n / b))
    eps = client_epsilon(sigma, delta, n, b, steps, rounds)
    if eps > worst:
      worst, at = eps, n
  return {"epsilon": worst, "delta": delta, "noise_multiplier": sigma,
          "clip": hp["dp_sgd_clip"], "batch_size": b, "worst_client_size": at,
          "rounds": rounds, "accountant": "rdp",
          "covered": "each example of a client, against everything the client sends "
                     "(sample level, every round counted)",
          "sampling": ("the whole client every step (q = 1)" if b is None else
                       f"shuffled batches of {b} per local epoch, accounted as Poisson "
                       "sampling at q = B/n (an approximation; Chua et al. 2024)")}
