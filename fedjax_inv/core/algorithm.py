"""An FL algorithm is a composition of small pure parts, not a subclass tree.

``Algorithm`` = local training recipe (client optimizer, local steps, batch size) +
client objective (task loss + ``Component`` loss terms) + aggregator + server optimizer +
the optional hooks of its ``Component``s. The engine (``core/engine.py``) knows nothing
about any particular paper; e.g. FedProx is a ``Component`` with a loss term, SCAFFOLD a
``Component`` with per-client state, a gradient correction and a server-side state, and
FedGMA is just a different ``Aggregator``. A new algorithm is one short file.

Message protocol of one round (DESIGN.md §1):
  1. server broadcasts ``ctx`` (global params, round, every component's server state);
  2. optional *pre-stage* per component: each sampled client computes a message at the
     global model, the server aggregates it and updates the component's server state
     (FedIIR's global classifier gradient; Fishr's mean gradient variance);
  3. each sampled client runs ``local_steps`` optimizer steps on its objective; its
     pseudo-gradient ``Δ_k = w_t − w_k`` (a gradient when ``local_steps=1`` and the
     client optimizer is ``sgd(1)``: FedSGD) goes to the aggregator; components may send
     extra messages and update per-client state;
  4. the server aggregates, lets components adjust the pseudo-gradient, and applies the
     server optimizer: ``w_{t+1} = w_t + server_opt(−aggregate)``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import optax

from fedjax_inv.core.aggregator import Aggregator, weighted_mean

PyTree = Any


@chex.dataclass(frozen=True)
class Batch:
  """One client's minibatch. ``x: [B, ...]``, ``y: [B]``, ``w: [B]`` example weights
  (1.0 real, 0.0 padding)."""
  x: chex.Array
  y: chex.Array
  w: chex.Array


class Forward(NamedTuple):
  """Outputs of one forward pass: ``z [B, d]`` representation, ``logits [B, K]``, ``aux``
  (component-defined, e.g. FedSR's (μ, σ))."""
  z: jax.Array
  logits: jax.Array
  aux: Any = None


@chex.dataclass(frozen=True)
class Context:
  """What a client sees in a round (the server's broadcast plus its own state).

  Attributes:
    params: global model parameters ``w_t`` (pytree).
    round: int32 scalar, the 0-based round index ``t``.
    extras: ``{component name: server state}``.
    client: ``{component name: this client's persistent state}`` (no client axis).
    num_clients: float32 scalar, size ``N`` of the client pool.
    cohort: float32 scalar, number ``C`` of clients sampled this round.
  """
  params: PyTree
  round: chex.Array
  extras: dict
  client: dict
  num_clients: chex.Array
  cohort: chex.Array


@dataclasses.dataclass(frozen=True)
class Component:
  """One composable piece of an algorithm. Every hook is optional (``None`` = absent).

  Hooks (``model`` is a ``FunctionalModel``, ``kind`` the task's loss kind):
    init_server(params) -> state: server-side state, in ``ctx.extras[name]``.
    init_client(params) -> state: per-client persistent state (the engine stacks one per
      pool client and gathers/scatters the sampled ones), in ``ctx.client[name]``.
    forward(model, params, x, key) -> Forward: replaces the default forward pass
      (at most one component per algorithm may set it; FedSR does).
    eval_forward(model, params, x, key) -> logits: prediction used by evaluation when the
      forward pass is stochastic (FedSR's Monte-Carlo average); default: ``forward``'s
      logits, else the deterministic model.
    loss(model, kind, params, batch, fwd, ctx, key) -> scalar: added to the client loss.
    loss_scale(ctx) -> scalar: the total client loss is divided by it (IRM's λ>1 rule).
    grad_estimator(value_and_grad_fn, params, batch, ctx, key) -> (loss, grads): replaces
      how one local step's gradient is estimated from the minibatch (FedILC intra-silo
      geometric mean over per-sample gradients). ``value_and_grad_fn(params, batch, key)``
      is the default estimator; a replacement may call it on sub-batches. When the
      client objective is the task loss alone, the engine also passes ``model=`` and
      ``kind=`` keywords (the estimator may exploit the model's structure).
    correct_grad(grads, ctx) -> grads: applied before the client optimizer (SCAFFOLD).
    pre_message(model, kind, params, data, ctx, key) -> message: pre-stage message of one
      client computed at the global model, ``data`` = (x [n_max,...], y [n_max], n).
    pre_aggregator: Aggregator for it (default weighted mean by client size).
    pre_update(state, aggregate, ctx) -> state: server updates its component state.
    message(model, kind, params0, params, data, ctx, key, local_steps, lr) ->
      (message, new_client_state): extra message after local training, and the client's
      new persistent state (return ``ctx.client[name]`` when unchanged, or None if the
      component has no client state).
    aggregator: Aggregator for ``message`` (default weighted mean).
    server_update(state, aggregate, pseudo_grad, ctx) -> (state, pseudo_grad): server
      side, after aggregation and before the server optimizer.

  Data field ``traced``: names of the hyperparameters the hooks read with
  :func:`hparam` (e.g. FedProx's ``'mu'``), so a sweep over them runs batched as one
  program (``fedjax_inv/sweep.py``); the value the component was built with is the
  fallback. A traced coefficient must not change the component's structure.
  """
  name: str
  init_server: Optional[Callable] = None
  init_client: Optional[Callable] = None
  forward: Optional[Callable] = None
  eval_forward: Optional[Callable] = None
  loss: Optional[Callable] = None
  loss_scale: Optional[Callable] = None
  grad_estimator: Optional[Callable] = None
  correct_grad: Optional[Callable] = None
  pre_message: Optional[Callable] = None
  pre_aggregator: Optional[Aggregator] = None
  pre_update: Optional[Callable] = None
  message: Optional[Callable] = None
  aggregator: Optional[Aggregator] = None
  server_update: Optional[Callable] = None
  traced: tuple = ()


# Key of ``ServerState.extras`` / ``Context.extras`` holding the traced hyperparameters
# of a batched sweep replica: ``{name: float32 scalar}`` (absent in ordinary runs).
HPARAMS = "__hparams__"
# Hyperparameters the engine itself can take as traced arrays (issue 13). The client and
# server optimizers are linear in their learning rate (sgd, momentum, adam(w), Reddi's
# adaptive ones, weight decay before the step), so a sweep builds them at lr = 1 and the
# engine multiplies their updates by the replica's traced rate.
ENGINE_TRACED = ("client_lr", "server_lr")


def hparam(ctx: "Context", name: str, default):
  """The traced value of hyperparameter ``name`` in a batched sweep replica (float32
  scalar, shared by all clients of the replica), else ``default`` (the built constant).

  Source: issue 13 (sweeps as one batched program, as ``optax.inject_hyperparams``
  keeps hyperparameters in the state rather than in the program)."""
  return ctx.extras.get(HPARAMS, {}).get(name, default)


WEIGHTINGS = ("num_examples", "uniform")


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """A federated algorithm as data.

  Attributes:
    name: registry name.
    client_optimizer: optax transformation for local steps (fresh state each round).
    server_optimizer: optax transformation applied to the aggregated pseudo-gradient.
    local_steps: K local optimizer steps per round (>= 1).
    batch_size: examples per local step sampled with replacement on device, or None for
      the client's full (unpadded) data every step.
    aggregator: client-axis reduction of the pseudo-gradients.
    weighting: 'num_examples' (FedAvg's n_k weights) or 'uniform'.
    components: tuple of ``Component``.
    client_lr: the client learning rate (SCAFFOLD's control variate update needs it).
    hparams: flat dict of the hyperparameters, for summaries.
    model_transform: optional ``FunctionalModel -> FunctionalModel`` applied to the
      task's model before training (FedSR adds its probabilistic representation head).
  """
  name: str
  client_optimizer: optax.GradientTransformation
  server_optimizer: optax.GradientTransformation
  local_steps: int = 1
  batch_size: Optional[int] = None
  aggregator: Aggregator = dataclasses.field(default_factory=weighted_mean)
  weighting: str = "num_examples"
  components: tuple = ()
  client_lr: float = 0.0
  hparams: dict = dataclasses.field(default_factory=dict)
  model_transform: Optional[Callable] = None

  def __post_init__(self):
    if self.local_steps < 1:
      raise ValueError(f"local_steps={self.local_steps}; it must be >= 1.")
    if self.batch_size is not None and self.batch_size < 1:
      raise ValueError(f"batch_size={self.batch_size}; use a positive int or None "
                       "(full client batch).")
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"weighting={self.weighting!r}; choose one of {WEIGHTINGS}.")
    names = [c.name for c in self.components]
    if len(set(names)) != len(names):
      raise ValueError(f"component names must be unique, got {names}.")
    for c in self.components:
      if (c.server_update is not None or c.pre_update is not None) and c.init_server is None:
        raise ValueError(
            f"component {c.name!r} updates server state but has no init_server: give it "
            "one (it fixes the state's structure, so round 2 does not recompile).")
    if sum(c.forward is not None for c in self.components) > 1:
      raise ValueError("at most one component may replace the forward pass.")
    if sum(c.grad_estimator is not None for c in self.components) > 1:
      raise ValueError("at most one component may replace the gradient estimator.")

  def model_for(self, model):
    """The model this algorithm trains, given the task's ``model``."""
    return model if self.model_transform is None else self.model_transform(model)

  def replace(self, **kw) -> "Algorithm":
    return dataclasses.replace(self, **kw)

  def with_component(self, component: Component) -> "Algorithm":
    return dataclasses.replace(self, components=self.components + (component,))
