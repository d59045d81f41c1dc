"""An FL algorithm is a composition of small pure parts, not a subclass tree.

``Algorithm`` = local training recipe (client optimizer, local steps, batch size) +
client objective (task loss + ``Component`` loss terms) + aggregator + server optimizer +
the optional hooks of its ``Component``s. The engine (``core/engine.py``) knows nothing
about any particular paper; e.g. FedProx is a ``Component`` with a loss term, SCAFFOLD a
``Component`` with per-client state, a gradient correction and a server-side state, and
FedGMA is just a different ``Aggregator``. A new algorithm is one short file.

Message protocol of one round (docs/ARCHITECTURE.md, 'A round is a map-reduce over a
client axis'):
  1. server broadcasts ``ctx`` (global params, round, every component's server state);
  2. optional *pre-stage* per component: each sampled client computes a message at the
     global model, the server aggregates it and updates the component's server state
     (FedIIR's global classifier gradient; Fishr's mean gradient variance);
  3. each sampled client runs ``local_steps`` optimizer steps on its objective; its
     pseudo-gradient ``Δ_k = w_t − w_k`` (a gradient when ``local_steps=1`` and the
     client optimizer is ``sgd(1)``: FedSGD) goes to the aggregator; components may send
     extra messages and update per-client state;
  4. the server aggregates and runs one *server chain* (:meth:`Algorithm.server_chain`):
     ``optax.named_chain`` of the components' ``server_stage``s (in
     component order; e.g. Fishr's ``+ λ∇L_Fishr``, SCAFFOLD's control update) and then
     the server optimizer (itself a chain, e.g. FedGMA's mask after the optimizer). Every
     stage is an optax ``GradientTransformationExtraArgs`` that also receives
     ``messages={component: aggregated message}`` and ``ctx``:
     ``w_{t+1} = w_t + chain(−aggregate)``.
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


class Objective(NamedTuple):
  """A client's objective as the engine hands it to a ``grad_estimator``.

  Calling it, ``objective(params, batch, key) -> (loss, grads)``, is the default
  estimate (``jax.value_and_grad`` of the client objective on ``batch``; ``loss`` a
  float32 scalar, ``grads`` shaped like ``params``). ``model`` (``FunctionalModel``) and
  ``kind`` ('binary' | 'multiclass' | 'regression') describe the task; ``task_only`` is
  True when the objective is the task loss alone (no component loss term, forward
  override or loss scale), so an estimator may use the model's structure (FedILC's
  dense-chain closed form) instead of calling ``value_and_grad``."""
  value_and_grad: Callable
  model: Any
  kind: str
  task_only: bool

  def __call__(self, params, batch, key):
    return self.value_and_grad(params, batch, key)


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
    grad_estimator(objective, params, batch, ctx, key) -> (loss, grads): replaces how
      one local step's gradient is estimated from the minibatch (FedILC intra-silo
      geometric mean over per-sample gradients). ``objective`` is an :class:`Objective`:
      calling it is the default estimator (a replacement may call it on sub-batches);
      its ``model``/``kind``/``task_only`` let it use the model's structure.
    client_stage: an optax ``GradientTransformationExtraArgs`` (build one with
      :func:`client_stage`): the component's element of the client chain, applied to each
      local step's gradient before the client optimizer (SCAFFOLD's ``g − c_i + c``).
    pre_message(model, kind, params, data, ctx, key) -> message: pre-stage message of one
      client computed at the global model, ``data`` = (x [n_max,...], y [n_max], n).
    pre_aggregator: Aggregator for it (default weighted mean by client size).
    pre_update(state, aggregate, ctx) -> state: server updates its component state.
    message(model, kind, params0, params, data, ctx, key) -> (message, new_client_state):
      extra message after local training, and the client's new persistent state (return
      ``ctx.client[name]`` when unchanged, or None if the component has no client state).
      A message of None sends nothing (no aggregator): the hook only updates the
      client's state (FedSR's local reference distribution).
    aggregator: Aggregator for ``message`` (default weighted mean).
    server_stage: an optax ``GradientTransformationExtraArgs`` (build one with
      :func:`server_stage`): the component's element of the server chain, before the
      server optimizer. Its ``update(pseudo_grad, state, params, *, messages, ctx)`` sees
      every component's aggregated message. When the component has no ``init_server``,
      the stage's state *is* its server state: clients read it as ``ctx.extras[name]``
      (SCAFFOLD's ``c``); otherwise the stage must be stateless.

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
  client_stage: Optional[optax.GradientTransformation] = None
  pre_message: Optional[Callable] = None
  pre_aggregator: Optional[Aggregator] = None
  pre_update: Optional[Callable] = None
  message: Optional[Callable] = None
  aggregator: Optional[Aggregator] = None
  server_stage: Optional[optax.GradientTransformation] = None
  traced: tuple = ()


def client_stage(update: Callable) -> optax.GradientTransformationExtraArgs:
  """A component's element of the client chain (stateless) as an optax transformation.

  Args:
    update: ``update(grads, ctx) -> grads``; ``grads`` is one local step's gradient of
      one client (shaped like the parameters), ``ctx`` the client's ``Context``.

  Returns:
    ``optax.GradientTransformationExtraArgs``; calling its ``update`` without the ``ctx``
    keyword raises ``TypeError``.

  Source: issue 14 (a client optimizer chain); SCAFFOLD (Karimireddy et al. 2020) Alg. 1
  line 10 is the example.
  """
  def update_fn(updates, state, params=None, *, ctx=None, **_):
    if ctx is None:
      raise TypeError("a component's client stage needs the keyword ctx= (the client's "
                      "Context); the engine's client_chain passes it.")
    return update(updates, ctx), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def server_stage(update: Callable, init: Optional[Callable] = None
                 ) -> optax.GradientTransformationExtraArgs:
  """A component's element of the server chain as an optax transformation.

  Args:
    update: ``update(pseudo_grad, state, messages, ctx) -> (pseudo_grad, state)``;
      ``pseudo_grad`` is shaped like the parameters (no client axis: already aggregated),
      ``messages`` is ``{component name: aggregated message}``, ``ctx`` the round's
      ``Context`` (``client={}``).
    init: ``init(params) -> state``; default ``optax.EmptyState()`` (a stateless stage).

  Returns:
    ``optax.GradientTransformationExtraArgs``; calling its ``update`` without the
    ``messages`` / ``ctx`` keywords raises ``TypeError`` naming them.

  Source: issue 14 (server chain of ``GradientTransformationExtraArgs``);
  docs/ARCHITECTURE.md, 'An algorithm is data'.
  """
  def init_fn(params):
    return optax.EmptyState() if init is None else init(params)

  def update_fn(updates, state, params=None, *, messages=None, ctx=None, **_):
    if messages is None or ctx is None:
      raise TypeError("a component's server stage needs the keywords messages= (the "
                      "aggregated client messages) and ctx= (the round's Context); the "
                      "engine's server_chain passes them.")
    return update(updates, state, messages, ctx)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


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
# What happens to a client's optimizer state between the rounds it takes part in
# (``Algorithm.client_optimizer_state``): 'restart' (a fresh ``init`` every round, FedAvg's
# ClientUpdate) or 'persistent' (initialized once, kept in the pool; FedSR's official code).
CLIENT_OPTIMIZER_STATES = ("restart", "persistent")
# Reserved key of the engine's per-client pool state ``client_states`` holding the
# persistent client-chain state (``client_optimizer_state='persistent'``). Component names
# may not take it (``Algorithm`` refuses), so it never clashes with ``init_client`` state.
CLIENT_OPT_STATE = "__client_optimizer__"


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """A federated algorithm as data.

  Attributes:
    name: registry name.
    client_optimizer: optax transformation for local steps (its state: see
      ``client_optimizer_state``).
    server_optimizer: optax transformation applied to the aggregated pseudo-gradient.
    local_steps: K local optimizer steps per round (>= 1).
    batch_size: examples per local step sampled with replacement on device, or None for
      the client's full (unpadded) data every step.
    aggregator: client-axis reduction of the pseudo-gradients.
    weighting: 'num_examples' (FedAvg's n_k weights) or 'uniform'.
    components: tuple of ``Component``.
    hparams: flat dict of the hyperparameters, for summaries.
    model_transform: optional ``FunctionalModel -> FunctionalModel`` applied to the
      task's model before training (FedSR adds its probabilistic representation head).
    client_optimizer_state: ``'restart'`` (default): the client chain
      (:meth:`client_chain`, i.e. the components' client stages and ``client_optimizer``)
      starts from ``init(w_t)`` in every round, as FedAvg's ClientUpdate (McMahan et al.
      2017, Alg. 1). ``'persistent'``: every pool client's chain state is created once,
      ``init(w_0)`` at the initial global parameters, kept in the engine's per-client
      pool ``client_states[CLIENT_OPT_STATE]`` (leading pool axis ``[N, ...]``, gathered
      for the sampled clients and scattered back after the round, like SCAFFOLD's
      ``c_i``) and continued in the next round the client is sampled in; its parameters
      still restart from ``w_t``. So SGD momentum buffers or Adam moments carry across
      rounds, as in FedSR's official code (each client's optimizer is created once).
      Recorded in ``hparams`` by the registered factories.

  Raises (on construction):
    ValueError: ``local_steps < 1``, ``batch_size < 1``, an unknown ``weighting`` or
      ``client_optimizer_state`` (names the value and the valid ones), ``hparams``
      recording another ``local_steps`` / ``client_optimizer_state`` than the algorithm
      runs, repeated or reserved component names, or several components replacing the
      forward pass / gradient estimator.
    TypeError: a ``client_stage`` / ``server_stage`` that is not an optax transformation.
  """
  name: str
  client_optimizer: optax.GradientTransformation
  server_optimizer: optax.GradientTransformation
  local_steps: int = 1
  batch_size: Optional[int] = None
  aggregator: Aggregator = dataclasses.field(default_factory=weighted_mean)
  weighting: str = "num_examples"
  components: tuple = ()
  hparams: dict = dataclasses.field(default_factory=dict)
  model_transform: Optional[Callable] = None
  client_optimizer_state: str = "restart"

  def __post_init__(self):
    if self.local_steps < 1:
      raise ValueError(f"local_steps={self.local_steps}; it must be >= 1.")
    if self.batch_size is not None and self.batch_size < 1:
      raise ValueError(f"batch_size={self.batch_size}; use a positive int or None "
                       "(full client batch).")
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"weighting={self.weighting!r}; choose one of {WEIGHTINGS}.")
    if self.client_optimizer_state not in CLIENT_OPTIMIZER_STATES:
      raise ValueError(f"client_optimizer_state={self.client_optimizer_state!r}; choose "
                       f"one of {CLIENT_OPTIMIZER_STATES} ('restart': a fresh client "
                       "optimizer state every round; 'persistent': each client keeps its "
                       "own across rounds).")
    # The run's summary must say what ran (and components built for K, e.g. SCAFFOLD's
    # control update dividing by K·η_l, must see the K that runs).
    for knob in ("client_optimizer_state", "local_steps"):
      runs, recorded = getattr(self, knob), self.hparams.get(knob, getattr(self, knob))
      if recorded != runs:
        raise ValueError(
            f"{self.name}: hparams record {knob}={recorded!r} but the algorithm runs "
            f"{knob}={runs!r}; build it anew (make_algorithm(name, {knob}={runs!r}, ...)) "
            "so that the run's summary and the components built for it agree.")
    names = [c.name for c in self.components]
    if len(set(names)) != len(names):
      raise ValueError(f"component names must be unique, got {names}.")
    if "server_optimizer" in names:
      raise ValueError("'server_optimizer' names the server optimizer's element of the "
                       "server chain; give the component another name.")
    for c in self.components:
      if c.pre_update is not None and c.init_server is None:
        raise ValueError(
            f"component {c.name!r} updates server state but has no init_server: give it "
            "one (it fixes the state's structure, so round 2 does not recompile).")
      for side in ("client", "server"):
        stage = getattr(c, f"{side}_stage")
        if stage is not None and not isinstance(stage, optax.GradientTransformation):
          raise TypeError(f"component {c.name!r}: {side}_stage must be an optax "
                          f"GradientTransformation(ExtraArgs), got {type(stage)}; build "
                          f"it with core.algorithm.{side}_stage(...).")
    if "client_optimizer" in names:
      raise ValueError("'client_optimizer' names the client optimizer's element of the "
                       "client chain; give the component another name.")
    if CLIENT_OPT_STATE in names:
      raise ValueError(f"{CLIENT_OPT_STATE!r} is the engine's key of the persistent client "
                       "optimizer state in the per-client pool; give the component another "
                       "name.")
    if sum(c.forward is not None for c in self.components) > 1:
      raise ValueError("at most one component may replace the forward pass.")
    if sum(c.grad_estimator is not None for c in self.components) > 1:
      raise ValueError("at most one component may replace the gradient estimator.")

  def client_chain(self) -> optax.GradientTransformationExtraArgs:
    """One local step's chain: ``optax.named_chain`` of each component's
    ``client_stage`` (component order) and then ``'client_optimizer'``. The engine calls
    ``update(grads, state, params, ctx=Context)`` from a fresh ``init(w_t)`` every round,
    or, with ``client_optimizer_state='persistent'``, from the client's own state of the
    last round it took part in (``init(w_0)`` before its first).

    Source: issue 14 (a client optimizer chain); FedAvg ClientUpdate (McMahan et al.
    2017, Alg. 1)."""
    stages = [(c.name, c.client_stage) for c in self.components
              if c.client_stage is not None]
    return optax.named_chain(*stages, ("client_optimizer", self.client_optimizer))

  @property
  def task_only(self) -> bool:
    """True when the client objective is the task loss alone: no component adds a loss
    term, replaces the forward pass or scales the loss (what ``Objective.task_only``
    tells a gradient estimator, and what the memory estimate assumes of it)."""
    return not any(c.loss or c.forward or c.loss_scale for c in self.components)

  def server_chain(self) -> optax.GradientTransformationExtraArgs:
    """The round's server chain: ``optax.named_chain`` of each component's
    ``server_stage`` (component order, named by the component), then
    ``'server_optimizer'`` (this algorithm's ``server_optimizer``, itself possibly a chain).

    ``update(pseudo_grad, state, params, messages={name: aggregated message}, ctx=Context)``
    maps the aggregated pseudo-gradient (shaped like the parameters, no client axis) to
    the server update. Its state is ``ServerState.opt_state`` (``{element name: state}``);
    a stage's state is what clients read as ``ctx.extras[name]`` when its component has no
    ``init_server`` (SCAFFOLD's ``c``, FedCurv's pool sums).

    Source: issue 14 (one server chain whose order is the algorithm); Reddi et al. 2021
    (server optimizer on the pseudo-gradient)."""
    stages = [(c.name, c.server_stage) for c in self.components
              if c.server_stage is not None]
    return optax.named_chain(*stages, ("server_optimizer", self.server_optimizer))

  def model_for(self, model):
    """The model this algorithm trains, given the task's ``model``."""
    return model if self.model_transform is None else self.model_transform(model)

  def replace(self, **kw) -> "Algorithm":
    return dataclasses.replace(self, **kw)

  def with_component(self, component: Component) -> "Algorithm":
    return dataclasses.replace(self, components=self.components + (component,))


# ---------------------------------------------------------------------------------------
# The algorithm registry: filled by ``fedjax_inv/algorithms`` (each family registers its
# factories on import; the package's ``__init__`` imports them all), read by the tasks
# (``Task.algorithm_settings`` drops the knobs an algorithm fixes) without importing an
# algorithm. ``make_algorithm`` is ``fedjax_inv.algorithms.base``'s.
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
  """A registered algorithm. ``fixed``: common knobs the algorithm sets itself (e.g.
  FedSGD's client recipe); a task's defaults for them are not passed to the factory."""
  name: str
  factory: Callable[..., Algorithm]
  paper: str
  summary: str
  fixed: tuple = ()


_REGISTRY: dict[str, Entry] = {}


def register(name: str, paper: str, summary: str, fixed: tuple = ()):
  """Decorator: registers ``factory`` under ``name`` (the paper's name for the method)."""
  def deco(factory):
    if name in _REGISTRY:
      raise ValueError(f"algorithm {name!r} is registered twice.")
    _REGISTRY[name] = Entry(name, factory, paper, summary, tuple(fixed))
    return factory
  return deco


def registry() -> dict[str, Entry]:
  return dict(_REGISTRY)
