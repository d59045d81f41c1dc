"""An FL algorithm is a composition of small pure parts, not a subclass tree.

``Algorithm`` = local training recipe (client optimizer, local steps, batch size) +
client objective (task loss + ``Component`` loss terms) + aggregator + server optimizer +
the optional hooks of its ``Component``s. The engine (``core/engine.py``) knows nothing
about any particular paper; e.g. FedProx is a ``Component`` with a loss term, SCAFFOLD a
``Component`` with per-client state, a gradient correction and a server-side state, and
FedGMA is just a different ``Aggregator``. A new algorithm is one short file.

Message protocol of one round (docs/ARCHITECTURE.md, 'A round is a map-reduce over a
client axis'), the five phases of a ``Component``'s hooks:
  1. server broadcasts ``ctx`` (global params, round, every component's server state);
  2. *pre-round*, per component with a ``pre_message``: each sampled client computes a
     message at the global model, the server aggregates it and updates the component's
     server state (FedIIR's global classifier gradient; Fishr's mean gradient variance);
  3. each sampled client runs ``local_steps`` optimizer steps on its *objective*; its
     pseudo-gradient ``Δ_k = w_t − w_k`` (a gradient when ``local_steps=1`` and the
     client optimizer is ``sgd(1)``: FedSGD) goes to the aggregator; components send
     *messages* and update their per-client *client state*;
  4. the server aggregates; the components' *server stages* run in component order
     (SCAFFOLD's control update, Fishr's ``+ λ∇L_Fishr``; each updates its own server
     state), then the server optimizer (an optax transformation that also receives
     ``messages={component: aggregated message}`` and ``ctx``, e.g. FedGMA's mask after
     the optimizer): ``w_{t+1} = w_t + server_optimizer(stages(−aggregate))``.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import optax

from fedjax_inv.core.aggregator import Aggregator, traced_names, weighted_mean

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
    cohort: float32 scalar, number ``C`` of clients sampled this round (the expected
      number under Poisson sampling).
    key: the server side's PRNG key of this round (``server_stage`` hooks: e.g. DP
      noise), derived from the run's seed and the round; None on the client side, whose
      hooks get their own ``key`` argument.
    local_steps: int32 scalar, the local steps this client runs this round when they
      differ by client (``Algorithm.local_epochs``: ``E * ceil(n_i / B)``); None when
      every client runs ``Algorithm.local_steps`` (SCAFFOLD's ``K`` reads it).
  """
  params: PyTree
  round: chex.Array
  extras: dict
  client: dict
  num_clients: chex.Array
  cohort: chex.Array
  key: Any = None
  local_steps: Any = None


# What each hook may read, by name: a hook declares the arguments it needs and the engine
# passes exactly those (docs/ARCHITECTURE.md, 'An algorithm is data'). Every client-side
# hook reads the client's view (``CLIENT_VIEW``) plus its phase's own input; every
# server-side hook reads the component's server ``state`` and the round's ``ctx`` plus its
# input; a forward pass reads the model, its parameters, the inputs and a key.
CLIENT_VIEW = ("model", "kind", "params", "batch", "ctx", "key")
FORWARD_VIEW = ("model", "params", "batch", "key")
HOOK_ARGUMENTS = {
    # 1. objective
    "loss": CLIENT_VIEW + ("fwd",),
    "loss_scale": ("ctx",),  # a divisor of the round (IRM's λ > 1 rule)
    "forward": FORWARD_VIEW,
    "eval_forward": FORWARD_VIEW,
    "grad_estimator": CLIENT_VIEW + ("objective",),
    "client_stage": ("grads", "params", "ctx"),
    # 2. client state
    "init_client": ("params",),
    "update_client": CLIENT_VIEW,
    # 3. pre-round
    "pre_message": CLIENT_VIEW,
    "pre_update": ("state", "aggregate", "ctx"),
    # 4. message
    "message": CLIENT_VIEW,
    # 5. server stage
    "init_server": ("params",),
    "server_stage": ("pseudo_grad", "state", "messages", "ctx"),
    # 6. personalization
    "personal_params": ("state",),
}


def hook_reads(hook: str, fn: Callable, owner: str = "") -> tuple | None:
  """The arguments hook function ``fn`` reads: the names of its parameters, all of them
  in ``HOOK_ARGUMENTS[hook]`` (a parameter with a default that is not there keeps its
  default); None when it takes ``**kwargs`` (it gets every argument of its hook).

  Raises:
    TypeError: a parameter without a default that the hook does not provide, or a
      positional-only one (e.g. ``lambda p, ctx: ...`` for a ``loss``), or ``*args``
      (nothing is passed by position): the message names the hook, the parameter and the
      names the hook provides.

  Source: docs/ARCHITECTURE.md, 'An algorithm is data'."""
  allowed = HOOK_ARGUMENTS[hook]
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError) as e:
    raise TypeError(f"{owner}{hook}: cannot read the signature of {fn!r} ({e}); give a "
                    f"Python function of some of {allowed}.") from None
  names = []
  for p in sig.parameters.values():
    if p.kind is p.VAR_KEYWORD:
      return None
    if p.kind is p.VAR_POSITIONAL:
      raise TypeError(
          f"{owner}{hook} hook {getattr(fn, '__name__', fn)!r} takes *{p.name}, but hooks "
          f"get their arguments by name, never by position; name the ones it reads out of "
          f"{allowed}, or take **kwargs.")
    if p.name in allowed and p.kind is not p.POSITIONAL_ONLY:
      names.append(p.name)
    elif p.default is p.empty:
      raise TypeError(
          f"{owner}{hook} hook {getattr(fn, '__name__', fn)!r} has a parameter "
          f"{p.name!r} that the engine does not provide; a {hook} hook reads its "
          f"arguments by name from {allowed} (declare the ones it needs, e.g. "
          f"def {hook}({', '.join(allowed[:2])}): ...).")
  return tuple(names)


def call_hook(hook: str, fn: Callable, **arguments):
  """``fn(**{the arguments it reads})``: how the engine calls every hook. ``arguments``
  are all of ``HOOK_ARGUMENTS[hook]`` (what the engine has at that point of the round).

  Source: docs/ARCHITECTURE.md, 'An algorithm is data'."""
  reads = hook_reads(hook, fn)
  return fn(**(arguments if reads is None else {k: arguments[k] for k in reads}))


@dataclasses.dataclass(frozen=True)
class Component:
  """One composable piece of an algorithm: optional hooks (``None`` = absent) grouped by
  the phase of the round they run in.

  A hook reads its arguments **by name**: it declares the ones it needs and the engine
  passes exactly those (``HOOK_ARGUMENTS``; a name it does not provide is a
  ``TypeError`` when the component is built). Every client-side hook may read the
  client's view: ``model`` (the task's ``FunctionalModel``), ``kind`` ('binary' |
  'multiclass' | 'regression'), ``params`` (the parameters the hook is about), ``batch``
  (the client's data, a :class:`Batch`), ``ctx`` (what the client sees, a
  :class:`Context`) and ``key`` (a PRNG key of its own), plus its phase's input; every
  server-side hook may read the component's server ``state`` and the round's ``ctx`` plus
  its input. ``call(hook, **arguments)`` calls one the engine's way (tests use it).

  1. Objective (every local step of every client; ``params`` the local model):
    loss(client view, fwd) -> scalar: added to the task loss (``fwd`` is the step's
      :class:`Forward`).
    loss_scale(ctx) -> scalar: the total client loss is divided by it, one value per
      round (IRM's λ>1 rule).
    forward(model, params, batch, key) -> Forward: replaces the default forward pass (at
      most one component per algorithm; FedSR's sampled representation). At evaluation
      ``batch`` holds the inputs only (``y`` and ``w`` None).
    eval_forward(model, params, batch, key) -> logits: the prediction evaluation uses
      when ``forward`` is stochastic (FedSR's Monte-Carlo average).
    grad_estimator(client view, objective) -> (loss, grads): replaces how a step's
      gradient is estimated (FedILC's intra-silo geometric mean); ``objective`` is an
      :class:`Objective`, calling it is the default estimate.
    client_stage: a function of ``(grads, params, ctx) -> grads``, or any optax
      transformation: the component's element of the client chain, applied to each
      step's gradient before the client optimizer (SCAFFOLD's ``g − c_i + c``).
  2. Client state (kept per pool client across rounds):
    init_client(params) -> state: stacked ``[N, ...]`` by the engine, the sampled
      clients' rows gathered and scattered back; a client reads ``ctx.client[name]``.
    update_client(client view) -> state: the client's new state after local training
      (``params`` the trained local model, ``ctx.params`` the global one); absent: the
      state is kept as it is.
  3. Pre-round (messages at the global model, before local training):
    pre_message(client view) -> message (``params`` = ``w_t``);
    pre_aggregator: its Aggregator (default: weighted mean by client weight);
    pre_update(state, aggregate, ctx) -> state: the component's new server state, which
      the clients of this round's local training then read.
  4. Message (after local training):
    message(client view) -> message (``params`` the trained local model, ``ctx.params``
      the global one);
    aggregator: its Aggregator (default: weighted mean by client weight).
  5. Server stage (once per round, before the server optimizer, in component order):
    init_server(params) -> state: the component's server state, its only home; clients
      read it as ``ctx.extras[name]``.
    server_stage: a function of ``(pseudo_grad, state, messages, ctx) -> (pseudo_grad,
      state)`` with ``messages`` ``{component: aggregated message}`` (SCAFFOLD's control
      update, Fishr's ``+ λ∇L_Fishr``); or, for a stage that needs no messages and no
      shared state, any optax transformation (its state is its own, in the server's
      optimizer state; FedSR's zeroed reference update).
  6. Personalization (evaluation only):
    personal_params(state) -> params: the client's own model, read from its client state
      (one client's, no pool axis): Ditto's personal parameters ``v_k``. The run then
      evaluates every pool client's personal model on that client's own rows of each
      evaluation set with one client per training client (``personal_val_*``) and on
      its training data (``personal_train_*``), beside the global model's metrics
      (``fedjax_inv.runner.simulation.personal_metrics``). At most one component has it.

  Data field ``traced``: names of the hyperparameters the hooks read with
  :func:`hparam` (e.g. FedProx's ``'mu'``), so a sweep over them runs batched as one
  program (``fedjax_inv/runner/sweep.py``); the value the component was built with is the
  fallback. A traced coefficient must not change the component's structure.

  Data field ``needs_split``: True when the hooks read the model's featurizer /
  classifier split (``model.features`` as a representation, ``model.classify``,
  ``params['classifier']``: Fishr, FedSR, FedIIR). An algorithm with such a component
  refuses a model without the split (``FunctionalModel.has_split``) in
  :meth:`Algorithm.model_for`, before anything compiles; every other algorithm trains
  any NNX module with a ``__call__``.

  Raises:
    TypeError: a hook that reads an argument its hook does not provide
      (:func:`hook_reads`).

  Source: docs/ARCHITECTURE.md, 'An algorithm is data'; docs/ALGORITHMS.md, 'Writing an
  algorithm'.
  """
  name: str
  # 1. objective
  loss: Optional[Callable] = None
  loss_scale: Optional[Callable] = None
  forward: Optional[Callable] = None
  eval_forward: Optional[Callable] = None
  grad_estimator: Optional[Callable] = None
  client_stage: Optional[Any] = None
  # 2. client state
  init_client: Optional[Callable] = None
  update_client: Optional[Callable] = None
  # 3. pre-round
  pre_message: Optional[Callable] = None
  pre_aggregator: Optional[Aggregator] = None
  pre_update: Optional[Callable] = None
  # 4. message
  message: Optional[Callable] = None
  aggregator: Optional[Aggregator] = None
  # 5. server stage
  init_server: Optional[Callable] = None
  server_stage: Optional[Any] = None
  # 6. personalization
  personal_params: Optional[Callable] = None
  traced: tuple = ()
  needs_split: bool = False

  def __post_init__(self):
    for hook in HOOK_ARGUMENTS:
      fn = getattr(self, hook)
      if fn is not None and callable(fn) and not is_optax(fn):
        hook_reads(hook, fn, owner=f"component {self.name!r}: ")

  def call(self, hook: str, **arguments):
    """Calls hook ``hook`` (a name of ``HOOK_ARGUMENTS``) the engine's way: with the
    arguments it reads out of ``arguments`` (which must hold every one it reads).

    Raises:
      ValueError: ``hook`` is not a hook name, or the component has no such hook.
      KeyError: ``arguments`` lacks one the hook reads."""
    if hook not in HOOK_ARGUMENTS:
      raise ValueError(f"{hook!r} is not a hook; the hooks are {tuple(HOOK_ARGUMENTS)}.")
    fn = getattr(self, hook)
    if fn is None or is_optax(fn):
      raise ValueError(f"component {self.name!r} has no {hook} function.")
    return call_hook(hook, fn, **arguments)


def client_stage(update: Callable) -> optax.GradientTransformationExtraArgs:
  """A stateless client stage function as an optax transformation (what the engine does
  with a function given as ``Component.client_stage``).

  Args:
    update: ``update(grads, params, ctx) -> grads``, reading those of its arguments it
      names (:func:`hook_reads`); ``grads`` is one local step's gradient of one client
      (shaped like the parameters), ``params`` the client's local model, ``ctx`` the
      client's ``Context``.

  Returns:
    ``optax.GradientTransformationExtraArgs``; calling its ``update`` without the ``ctx``
    keyword raises ``TypeError``.

  Source: a client optimizer chain (optax); SCAFFOLD (Karimireddy et al. 2020) Alg. 1
  line 10 is the example.
  """
  hook_reads("client_stage", update)

  def update_fn(updates, state, params=None, *, ctx=None, **_):
    if ctx is None:
      raise TypeError("a component's client stage needs the keyword ctx= (the client's "
                      "Context); the engine's client_chain passes it.")
    return call_hook("client_stage", update, grads=updates, params=params, ctx=ctx), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def is_optax(stage) -> bool:
  """True when a ``client_stage`` / ``server_stage`` is an optax transformation (its
  state kept by the engine), False when it is a plain function."""
  return isinstance(stage, optax.GradientTransformation)


# Key of ``ServerState.extras`` / ``Context.extras`` holding the traced hyperparameters
# of a batched sweep replica: ``{name: float32 scalar}`` (absent in ordinary runs).
HPARAMS = "__hparams__"


def hparam(ctx: "Context", name: str, default):
  """The traced value of hyperparameter ``name`` in a batched sweep replica (float32
  scalar, shared by all clients of the replica), else ``default`` (the built constant).

  Source: sweeps as one batched program (as ``optax.inject_hyperparams``
  keeps hyperparameters in the state rather than in the program)."""
  return ctx.extras.get(HPARAMS, {}).get(name, default)


def learning_rate_in_round(name: str, make: Callable[[Any], optax.GradientTransformation],
                           value: float) -> optax.GradientTransformationExtraArgs:
  """An optimizer whose learning rate is a runtime value of the round.

  Every ``update(updates, state, params, ctx=Context)`` builds ``make(lr)`` with ``lr =
  hparam(ctx, name, value)``: the built constant ``value`` in an ordinary run (the same
  program as ``make(value)``), the replica's float32 scalar in a batched sweep. One path
  for fixed and swept rates. The state is ``make(value).init``'s, so ``make`` must keep
  the rate out of the state (every optax optimizer does). ``name`` is recorded on the
  update function, where :func:`optimizer_traced` (the sweep planner) finds it.

  Args:
    name: the hyperparameter (``'client_lr'`` or ``'server_lr'``).
    make: ``lr -> optax transformation``; called with a float or a traced scalar, so it
      must not branch on the value (validate ``value`` before).
    value: the built rate (> 0, checked by the caller).

  Source: sweeps as one batched program (the rate as an argument of the round, as
  ``optax.inject_hyperparams`` keeps it in the state).
  """
  built = make(value)

  def update(updates, state, params=None, *, ctx=None, **extra):
    del extra  # the server chain's messages: the optimizer reads only its rate
    lr = value if ctx is None else hparam(ctx, name, value)
    return (built if lr is value else make(lr)).update(updates, state, params)

  update.traced = (name,)
  return optax.GradientTransformationExtraArgs(built.init, update)


def reading(opt: optax.GradientTransformation, names) -> optax.GradientTransformationExtraArgs:
  """``opt`` marked as reading the traced hyperparameters ``names``: e.g. an
  ``optax.chain`` around a :func:`learning_rate_in_round` optimizer (FedGMA's mask after
  its base's server optimizer), so that :func:`optimizer_traced` still finds them. The
  updates are ``opt``'s, unchanged.

  Source: sweeps as one batched program (:func:`learning_rate_in_round`)."""
  inner = optax.with_extra_args_support(opt)

  def update(updates, state, params=None, **extra):
    return inner.update(updates, state, params, **extra)

  update.traced = tuple(names)
  return optax.GradientTransformationExtraArgs(inner.init, update)


def optimizer_traced(opt) -> tuple:
  """The traced hyperparameters an optimizer reads in the round: ``()`` for a plain optax
  one, ``('client_lr',)`` / ``('server_lr',)`` for the library's optimizers
  (:func:`learning_rate_in_round`)."""
  return tuple(getattr(getattr(opt, "update", None), "traced", ()))


WEIGHTINGS = ("num_examples", "uniform")
# What happens to a client's optimizer state between the rounds it takes part in
# (``Algorithm.client_optimizer_state``): 'restart' (a fresh ``init`` every round, FedAvg's
# ClientUpdate) or 'persistent' (initialized once, kept in the pool; FedSR's official code).
CLIENT_OPTIMIZER_STATES = ("restart", "persistent")
# Reserved key of the engine's per-client pool state ``client_states`` holding the
# persistent client-chain state (``client_optimizer_state='persistent'``). Component names
# may not take it (``Algorithm`` refuses), so it never clashes with ``init_client`` state.
CLIENT_OPT_STATE = "__client_optimizer__"
# How a round's clients are drawn from the pool (``Algorithm.client_sampling``): 'fixed'
# (exactly C, uniformly without replacement) or 'poisson' (each pool client independently
# with probability q = C / N; the cohort is a padded buffer of core.strategy.poisson_slots
# slots, empty slots weigh 0).
CLIENT_SAMPLINGS = ("fixed", "poisson")


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """A federated algorithm as data.

  Attributes:
    name: registry name.
    client_optimizer: optax transformation for local steps (its state: see
      ``client_optimizer_state``).
    server_optimizer: optax transformation applied to the aggregated pseudo-gradient.
    local_steps: K local optimizer steps per round (>= 1); ignored when ``local_epochs``
      is set.
    local_epochs: None (default: every client runs ``local_steps``), or ``E >= 1``:
      client ``i`` runs ``E * ceil(n_i / batch_size)`` steps, each epoch one pass over a
      fresh permutation of its real examples in batches of ``batch_size`` (the last one
      partial, its padding weighing 0): the "E local epochs of batch B" protocol of
      FedAvg (McMahan et al. 2017, Alg. 1) and Reddi et al. 2021 (App. D). Clients of
      different sizes run different step counts (``core.client.local_train``).
    attack: None, or a ``core.adversary.Attack``: malicious clients' updates (or labels)
      manipulated inside the round (``fedjax_inv.adversary.apply``).
    participation: None, or a ``core.adversary.Participation``: availability, dropout
      and stragglers (``fedjax_inv.adversary.apply``).
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
    client_sampling: ``'fixed'`` (default): each round draws exactly ``C`` pool clients
      uniformly without replacement. ``'poisson'``: each pool client takes part
      independently with probability ``q = C / N`` (what the DP accountants assume;
      ``fedjax_inv/privacy/client_dp.py``), in a padded buffer of ``strategy.poisson_slots(N, C)``
      slots whose empty slots weigh 0.

  Raises (on construction):
    ValueError: ``local_steps < 1``, ``batch_size < 1``, ``local_epochs < 1`` or
      ``local_epochs`` without a ``batch_size``, an unknown ``weighting`` or
      ``client_optimizer_state`` (names the value and the valid ones), ``hparams``
      recording another ``local_steps`` / ``client_optimizer_state`` than the algorithm
      runs, repeated or reserved component names, several components replacing the
      forward pass / gradient estimator or holding personal models, or a component with
      ``personal_params`` but no ``init_client``.
    TypeError: a ``client_stage`` / ``server_stage`` that is neither a function nor an
      optax transformation.
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
  client_sampling: str = "fixed"
  local_epochs: Optional[int] = None
  attack: Any = None
  participation: Any = None

  def __post_init__(self):
    if self.local_steps < 1:
      raise ValueError(f"local_steps={self.local_steps}; it must be >= 1.")
    if self.local_epochs is not None:
      if isinstance(self.local_epochs, bool) or int(self.local_epochs) != self.local_epochs \
          or self.local_epochs < 1:
        raise ValueError(f"local_epochs={self.local_epochs!r}; use an integer >= 1 (passes "
                         "over each client's data per round), or None for local_steps.")
      if self.batch_size is None:
        raise ValueError("local_epochs needs a batch_size (E passes in batches of B); with "
                         "batch_size=None (the whole client) use local_steps=E instead.")
    if self.batch_size is not None and self.batch_size < 1:
      raise ValueError(f"batch_size={self.batch_size}; use a positive int or None "
                       "(full client batch).")
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"weighting={self.weighting!r}; choose one of {WEIGHTINGS}.")
    if self.client_sampling not in CLIENT_SAMPLINGS:
      raise ValueError(f"client_sampling={self.client_sampling!r}; choose one of "
                       f"{CLIENT_SAMPLINGS} ('fixed': exactly C clients per round; "
                       "'poisson': each client independently with probability C/N).")
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
        if stage is not None and not (is_optax(stage) or callable(stage)):
          raise TypeError(f"component {c.name!r}: {side}_stage must be a function or an "
                          f"optax GradientTransformation, got {type(stage)}.")
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
    for c in self.components:
      if c.personal_params is not None and c.init_client is None:
        raise ValueError(f"component {c.name!r} has personal_params but no init_client: "
                         "its personal model is read from its per-client state; give it "
                         "one.")
    if sum(c.personal_params is not None for c in self.components) > 1:
      raise ValueError("at most one component may hold the clients' personal models "
                       "(personal_params).")

  def client_chain(self) -> optax.GradientTransformationExtraArgs:
    """One local step's chain: ``optax.named_chain`` of each component's
    ``client_stage`` (component order; a function stage wrapped by :func:`client_stage`)
    and then ``'client_optimizer'``. The engine calls ``update(grads, state, params,
    ctx=Context)`` from a fresh ``init(w_t)`` every round, or, with
    ``client_optimizer_state='persistent'``, from the client's own state of the last
    round it took part in (``init(w_0)`` before its first).

    Source: a client optimizer chain (optax); FedAvg ClientUpdate (McMahan et al.
    2017, Alg. 1)."""
    stages = [(c.name, c.client_stage if is_optax(c.client_stage)
               else client_stage(c.client_stage))
              for c in self.components if c.client_stage is not None]
    return optax.named_chain(*stages, ("client_optimizer", self.client_optimizer))

  @property
  def traced(self) -> tuple:
    """The hyperparameters this algorithm reads in the round (:func:`hparam`), so a batched
    sweep can give each replica its own value: its optimizers' learning rates
    (:func:`optimizer_traced`), its components' ``traced`` and its aggregator's
    (``core.aggregator.traced_names``). Sorted."""
    return tuple(sorted(set(optimizer_traced(self.client_optimizer))
                        | set(optimizer_traced(self.server_optimizer))
                        | {n for c in self.components for n in c.traced}
                        | set(traced_names(self.aggregator))))

  @property
  def task_only(self) -> bool:
    """True when the client objective is the task loss alone: no component adds a loss
    term, replaces the forward pass or scales the loss (what ``Objective.task_only``
    tells a gradient estimator, and what the memory estimate assumes of it)."""
    return not any(c.loss or c.forward or c.loss_scale for c in self.components)

  @property
  def personal(self) -> Optional[Component]:
    """The component holding each client's personal model (``personal_params``; Ditto),
    or None for an algorithm that trains only the global model."""
    return next((c for c in self.components if c.personal_params is not None), None)

  def server_optimizer_state(self, params) -> dict:
    """The server's optimizer state ``ServerState.opt_state``: ``{component name: state}``
    for each component whose ``server_stage`` is an optax transformation, and
    ``'server_optimizer'``: ``server_optimizer.init(params)``. Components' own server
    state is not here: it is ``ServerState.extras`` (``init_server``).

    Source: Reddi et al. 2021 (server optimizer on the pseudo-gradient)."""
    state = {c.name: c.server_stage.init(params) for c in self.components
             if c.server_stage is not None and is_optax(c.server_stage)}
    state["server_optimizer"] = self.server_optimizer.init(params)
    return state

  def model_for(self, model):
    """The model this algorithm trains, given the task's ``model`` (a
    ``FunctionalModel``): ``model_transform(model)``, or ``model`` itself.

    Raises:
      ValueError: a component needs the featurizer / classifier split
        (``Component.needs_split``) and ``model`` has none (``model.has_split`` False);
        one line naming the algorithm, the component and what the model must expose.
    """
    self.check_model(model)
    return model if self.model_transform is None else self.model_transform(model)

  def check_model(self, model) -> None:
    """Raises ValueError when a component needs the featurizer / classifier split
    (``Component.needs_split``) and ``model`` (a ``FunctionalModel``) lacks it. A model
    object without ``has_split`` is taken to have the split. Runs no model code beyond
    rebuilding the module from its parameter template: no tracing, no compile."""
    needing = [c.name for c in self.components if c.needs_split]
    if not needing or getattr(model, "has_split", True):
      return
    has = tuple(getattr(model, "split_parts", ()))
    what = f"only .{has[0]}" if has else "neither"
    name = getattr(model, "module_name", type(model).__name__)
    reads = ("" if needing == [self.name] else
             f" (component {', '.join(repr(n) for n in needing)} reads them)")
    raise ValueError(
        f"{self.name} needs a model with .featurizer ([B, ...] -> [B, d]) and .classifier "
        f"([B, d] -> [B, K]){reads}; {name} has {what}. Split the model into those two "
        "attributes (see models.mlp).")

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
