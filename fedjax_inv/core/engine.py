"""The round engine: one jitted function per round, vectorized over a client axis.

``build_round`` returns ``round_fn(server, client_states, data, key) -> (server,
client_states, metrics)``. Inside it: sample ``C`` of the ``N`` pool clients (uniform,
without replacement, per-round key), gather their data and state from the device-resident
pool, run the (optional) pre-stage and the local-training stage as map-reduces over the
client axis, aggregate with associative reductions (``Aggregator``: sums only), apply the
server optimizer, and scatter updated per-client state back into the pool.

Execution strategies for each map-reduce (all give the same numbers up to float32
summation order, because aggregation is a sum of lifted statistics):
  * ``vmap``: all sampled clients at once (best on GPU/TPU; client axis sharded over a
    ``clients`` mesh axis when several devices are present);
  * ``scan``: one client at a time under ``lax.scan``, streaming the sums (best on CPU:
    measured 1.2–1.7× a Python loop over a jitted client update on 2 cores, where plain
    ``jit(vmap)`` was 0.5–0.9×);
  * ``chunked``: ``vmap`` inside chunks of ``chunk_size`` clients, ``scan`` across chunks;
  * ``auto``: ``scan`` on a single CPU device, otherwise ``vmap`` (sharded) when the cohort
    fits the memory estimate, else ``chunked``; on a GPU a model's convolutions run in
    the 'patches' form (``vmap+patches``; ``memory.auto_conv_form``).

The benchmark baseline, a Python loop over the clients of one compiled client update
(FedJAX's design), is not a strategy of the engine: it is
``fedjax_inv.benchmarks.loop_round.LoopRound``, built from the same :func:`round_parts`.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_inv.core import losses
from fedjax_inv.core.algorithm import CLIENT_OPT_STATE, HPARAMS, Algorithm, is_optax
from fedjax_inv.core import strategy as strategy_lib
# One client's computation and the initial state live in their own modules (the memory
# estimate traces them too); re-exported here, where the rest of the package finds them.
from fedjax_inv.core.client import (  # noqa: F401
    batch_indices, client_context, client_outputs, client_steps, default_forward,
    eval_logits_fn, full_batch, local_train, make_objective, mean_step_loss, step_gradient)
from fedjax_inv.core.state import ServerState, init_state  # noqa: F401
from fedjax_inv.core import adversary
from fedjax_inv.core.aggregator import (  # noqa: F401 (as_gathered: re-exported)
    Aggregator, as_gathered, lift, main_aggregator, traced_names, weighted_mean)
from fedjax_inv.core.data import ClientData

PyTree = Any
STRATEGIES = strategy_lib.STRATEGIES
PRE_CHUNK = strategy_lib.PRE_CHUNK  # the pre-stage's chunks under 'scan' (core/strategy.py)


def resolve_strategy(execution: str, cohort: int, num_devices: int | None = None,
                     backend: str | None = None) -> str:
  """Maps ``auto`` to a concrete strategy (see module docstring); validates the name.

  On one CPU device: ``scan`` (dense and conv models alike: measured 1.9x a per-client
  loop for the MNIST MLP at C=1000 and 1.5x for the ConvNet at C=100 on 2 cores, where
  ``vmap`` was 0.3-0.7x; convolutions use ``models.conv.conv_general_dilated``, whose
  gradients XLA:CPU runs fast inside loops). Elsewhere (GPU/TPU, or several devices):
  ``vmap``. :func:`build_round`, given the data shapes, refines the second case: 'chunked'
  when vmap does not fit in memory; on a GPU, a model with convolutions in the 'patches'
  form (``memory.auto_conv_form``; measured on an H200 at C=1000: 'vmap+patches' 5.9x
  the 'chunked' round, 11.7x 'vmap'); elsewhere, 'chunked' for a model with convolutions
  above ``memory.CONV_VMAP_MAX`` clients per device (measured on an H200 at C=1000: a
  vmapped ConvNet round 5.4x slower than chunks of 50).
  """
  if execution not in STRATEGIES:
    raise ValueError(f"execution={execution!r}; choose one of {STRATEGIES}.")
  if execution != "auto":
    return execution
  return strategy_lib.base_strategy(backend, num_devices)


def cohort_slots(algorithm: Algorithm, num_clients: int, clients_per_round: int) -> int:
  """The client axis of a round: ``C`` with fixed-size sampling, the padded buffer
  ``strategy.poisson_slots(N, C)`` with Poisson sampling (``Algorithm.client_sampling``)."""
  if algorithm.client_sampling == "poisson":
    return strategy_lib.poisson_slots(num_clients, clients_per_round)
  return clients_per_round


def poisson_sample(key, num_clients: int, rate: float, slots: int) -> jax.Array:
  """Poisson client sampling: ``[slots]`` int32 pool indices. Each pool client takes part
  independently with probability ``rate`` (``u_i < rate``, ``u ~ U[0, 1)^N`` from
  ``key``); the sampled clients fill the first slots in increasing ``u`` (a uniformly
  random order), the rest are ``N`` (an empty slot). With more sampled clients than
  slots the ones of largest ``u`` are left out (``strategy.POISSON_MARGIN_SD``).

  Source: the sampling the DP accountants assume (Abadi et al. 2016; McMahan et al.
  2018, Alg. 1 "each user independently with probability q")."""
  u = jax.random.uniform(key, (num_clients,))
  take = u < rate
  order = jnp.argsort(jnp.where(take, u, 2.0))[:slots]
  filled = jnp.arange(slots) < jnp.sum(take)
  return jnp.where(filled, order, num_clients).astype(jnp.int32)


def server_key(key, round_):
  """The server side's key of round ``round_`` (``Context.key`` in server stages): its
  own stream, apart from the round's sampling and client keys."""
  return jax.random.fold_in(jax.random.fold_in(key, round_), 0x5E4FE4)


def client_mesh(num_devices: int | None = None) -> Mesh | None:
  """A 1-D mesh with axis ``'clients'`` over all (or the first ``num_devices``) devices,
  or None with a single device."""
  devices = jax.devices()[: (num_devices or jax.device_count())]
  if len(devices) <= 1:
    return None
  return Mesh(np.array(devices), ("clients",))


def map_reduce(fn: Callable, xs: PyTree, strategy: str, chunk_size: int | None = None,
               mesh: Mesh | None = None, unroll: int = 1):
  """Runs ``fn`` on every client of ``xs`` (pytree, leading client axis ``C``) and sums.

  Args:
    fn: ``client_inputs -> (stats, outs)``; ``stats`` is summed over clients, ``outs`` is
      stacked (``[C, ...]``).
    xs: pytree whose leaves have a leading client axis ``C``.
    strategy: 'vmap' | 'scan' | 'chunked' (already resolved).
    chunk_size: clients per chunk for 'chunked' (rounded down to a divisor of ``C``).
    mesh: optional ``clients`` mesh; under 'vmap'/'chunked' the client axis is sharded.
    unroll: clients per iteration of the 'scan' loop (``lax.scan(unroll=...)``): lets
      XLA overlap independent clients' work across CPU cores.

  Returns:
    ``(stats summed over the C clients, outs stacked [C, ...])``.
  """
  cohort = jax.tree.leaves(xs)[0].shape[0]

  def shard(tree, axis):
    if mesh is None:
      return tree
    ndev = mesh.devices.size
    def one(a):
      if a.shape[axis] % ndev:
        return a
      spec = [None] * a.ndim
      spec[axis] = "clients"
      return jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P(*spec)))
    return jax.tree.map(one, tree)

  if strategy == "vmap":
    stats, outs = jax.vmap(fn)(shard(xs, 0))
    return jax.tree.map(lambda s: jnp.sum(s, axis=0), stats), outs

  first = jax.tree.map(lambda a: a[0], xs)
  stat_shapes = jax.eval_shape(lambda x: fn(x)[0], first)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), stat_shapes)

  if strategy == "scan":
    def body(carry, x):
      s, o = fn(x)
      return jax.tree.map(jnp.add, carry, s), o
    return jax.lax.scan(body, zeros, xs, unroll=max(1, min(unroll, cohort)))

  if strategy == "chunked":
    k = strategy_lib.largest_divisor_at_most(cohort, cohort if chunk_size is None else chunk_size)
    xs_c = jax.tree.map(lambda a: a.reshape((cohort // k, k) + a.shape[1:]), xs)

    def body(carry, xc):
      s, o = jax.vmap(fn)(shard(xc, 0))
      return jax.tree.map(lambda c, t: c + jnp.sum(t, axis=0), carry, s), o
    sums, outs = jax.lax.scan(body, zeros, xs_c)
    outs = jax.tree.map(lambda a: a.reshape((cohort,) + a.shape[2:]), outs)
    return sums, outs
  raise ValueError(f"strategy={strategy!r}; expected 'vmap', 'scan' or 'chunked'.")


def build_round(model, kind: str, algorithm: Algorithm, num_clients: int,
                clients_per_round: int, execution: str = "auto",
                chunk_size: int | None = None, mesh: Mesh | None = None,
                jit: bool = True, unroll: int | None = None,
                feature_shape: tuple | None = None, n_max: int | None = None,
                streamed: bool = False) -> Callable:
  """Builds one federated round as a single (jitted) function.

  Args:
    model: ``FunctionalModel``.
    kind: 'binary' | 'multiclass' | 'regression'.
    algorithm: ``Algorithm``.
    num_clients: pool size ``N``.
    clients_per_round: cohort ``C`` (1 <= C <= N), sampled uniformly without replacement
      (``algorithm.client_sampling='fixed'``), or the expected cohort ``q N`` of Poisson
      sampling (``'poisson'``: the client axis is ``cohort_slots`` slots).
    execution: 'auto' | 'vmap' | 'scan' | 'chunked', or 'vmap+patches' /
      'chunked+patches': the same strategy with the model's convolutions in the 'patches'
      form (``strategy.CONV_FORMS``: im2col and one matrix product, batched over the
      clients instead of one grouped convolution; equal up to float32 summation order).
      ('loop', the benchmark baseline, is ``fedjax_inv.benchmarks.loop_round.LoopRound``,
      built directly.)
    chunk_size: clients per chunk for 'chunked' (default: ``min(C, 64)``).
    mesh: a ``clients`` mesh (``client_mesh()``) to shard the client axis, or None.
    unroll: clients per loop iteration under 'scan' (default ``strategy.SCAN_UNROLL``).
    feature_shape: per-example input shape; with ``n_max`` it enables the memory
      estimate (``core/memory.py``) before compiling.
    n_max: padded examples per client.
    streamed: False (default): ``data`` and ``client_states`` are the whole pool
      (``[N, n_max, ...]`` and ``[N, ...]``) and the round gathers its cohort from
      them. True: they are the round's cohort only, in sampling order (slot ``j`` holds
      pool client ``metrics['clients'][j]``: ``[slots, width, ...]`` and ``[slots,
      ...]``), gathered on the host by ``core.stream.StreamedRound``; the returned client
      states are the cohort's new states in the same slot order (the host scatters
      them). ``round_fn.sample(round, key) -> [slots]`` gives the cohort of a round
      before it runs. Same numbers as the resident pool for the same seed.

  Returns:
    ``round_fn(server: ServerState, client_states: dict, data: ClientData, key) ->
    (ServerState, client_states, metrics)`` with metrics ``{'train_loss': scalar (mean
    local loss, client-weighted), 'clients': [C] int32 sampled pool indices}`` (Poisson
    sampling: ``[slots]``, ``N`` for an empty slot, and ``'cohort_size'``, the clients
    that ran); its
    ``strategy`` attribute names the strategy of the client axis that runs ('auto'
    resolved; 'vmap' for 'vmap+patches'), ``conv_form`` the convolution form ('lax' or
    'patches'), ``execution`` both as one name ('vmap+patches', else the strategy) and
    ``chunk_size`` the clients per chunk under 'chunked' (else None).

  Raises:
    ValueError: bad cohort size, strategy name (``'loop'`` included: the message names
      the benchmarks' ``LoopRound``) or ``chunk_size`` < 1 (before any compile).
    DoesNotFitError (a MemoryError and ValueError): an explicit strategy whose estimated
      memory exceeds the device's budget (message: the numbers and the fix).
  """
  losses.check_kind(kind)
  if not 1 <= clients_per_round <= num_clients:
    raise ValueError(f"clients_per_round={clients_per_round} must be in [1, {num_clients}] "
                     f"(the pool has {num_clients} clients).")
  if execution == "loop":  # the baseline moved to the benchmarks (core imports only core)
    raise ValueError(
        "execution='loop' is not an engine strategy: the Python loop over one compiled "
        "client update (the benchmark baseline) is built directly as "
        "fedjax_inv.benchmarks.loop_round.LoopRound(model, kind, algorithm, num_clients, "
        f"clients_per_round); for the engine choose one of {STRATEGIES}.")
  if execution not in STRATEGIES:
    raise ValueError(f"execution={execution!r}; choose one of {STRATEGIES}.")
  execution, form = strategy_lib.split_execution(execution)
  strategy = resolve_strategy(execution, clients_per_round)
  # The round's client axis: C, or the padded Poisson buffer (cohort_slots).
  masked = masked_slots(algorithm)  # some slots can be empty (index N, weight 0)
  slots = cohort_slots(algorithm, num_clients, clients_per_round)
  if chunk_size is not None and (isinstance(chunk_size, bool) or int(chunk_size) != chunk_size
                                 or chunk_size < 1):
    raise ValueError(f"chunk_size={chunk_size!r}; it must be an integer >= 1 (or None for "
                     "the default min(C, 64)).")
  chunk = min(slots, 64) if chunk_size is None else int(chunk_size)
  if feature_shape is not None and n_max is not None:  # the memory check, before compiling
    from fedjax_inv.core import memory
    ndev = mesh.devices.size if mesh is not None else 1
    # ``model`` is already the algorithm's model (model_transform applied by the caller).
    alg_m = algorithm.replace(model_transform=None)
    if execution == "auto":  # the whole rule, memory and convolution form included
      name, auto_chunk = memory.auto_strategy(model, alg_m, slots, n_max, feature_shape,
                                              shard_devices=ndev)
      strategy, form = strategy_lib.split_execution(name)
      chunk = chunk if auto_chunk is None else auto_chunk
    else:  # an explicit strategy that cannot fit raises DoesNotFitError with the fix
      with strategy_lib.conv_form(form):
        memory.check_fits(model, alg_m, slots, n_max, feature_shape, strategy,
                          chunk if strategy == "chunked" else None, num_devices=ndev)
  unroll = strategy_lib.SCAN_UNROLL if unroll is None else int(unroll)
  parts = round_parts(model, kind, algorithm, num_clients, clients_per_round)
  # Per-client step counts (local_epochs) under 'chunked': a chunk runs to its largest
  # client's count, so the cohort is ordered by size first (the size buckets).
  sort_by_size = algorithm.local_epochs is not None and strategy == "chunked"

  def round_fn(server: ServerState, client_states: dict, data: ClientData, key):
    idx, ckeys, flags = parts.sample(server, key)
    # The data row of each slot: the pool row (resident), or the slot (streamed cohort).
    rows = jnp.arange(slots, dtype=jnp.int32) if streamed else (
        jnp.minimum(idx, num_clients - 1) if masked else idx)
    if sort_by_size:  # size buckets: chunks of similar sizes run similar step counts
      order = jnp.argsort(-data.n[rows], stable=True)
      idx, ckeys, rows = idx[order], ckeys[order], rows[order]
      flags = jax.tree.map(lambda a: a[order], flags)
    # Clients read their rows of the device-resident pool inside the map (a dynamic slice
    # per client under 'scan'), so the cohort's data is never copied as a whole: at
    # C=10,000 MNIST clients that copy was 1.9 GiB per round. An empty Poisson slot
    # (index N) reads row N-1 and weighs 0; its state is not written back.
    xs = (idx, data.n[rows], jax.tree.map(lambda a: a[rows], client_states), ckeys, flags,
          rows)
    extras = server.extras
    if parts.pre_client is not None:
      pre_strategy, pre_chunk = strategy, chunk
      if strategy == "scan" and PRE_CHUNK:  # see PRE_CHUNK
        pre_strategy, pre_chunk = "chunked", PRE_CHUNK
      pre_sums, _ = map_reduce(lambda inp: (parts.pre_client(server, data, inp), None), xs,
                               pre_strategy, pre_chunk, mesh, unroll)
      extras = parts.pre_finish(server, pre_sums)
    def run_client(inp):  # gathered messages (robust aggregators) are stacked, not summed
      stats, cs = parts.client(server, extras, data, inp)
      if not parts.gathered:
        return stats, cs
      return ({k: v for k, v in stats.items() if k not in parts.gathered},
              (cs, {k: stats[k] for k in parts.gathered}))
    sums, outs = map_reduce(run_client, xs, strategy, chunk, mesh, unroll)
    new_cstates = outs
    if parts.gathered:
      new_cstates, stacked = outs
      sums = {**sums, **stacked}
    new_server, metrics = parts.finish(server, extras, sums, key)
    if streamed:  # the cohort's new states, back in slot order, for the host to scatter
      client_states = jax.tree.map(lambda old, new: old.at[rows].set(new),
                                   client_states, new_cstates)
      if masked:
        metrics["cohort_size"] = jnp.sum(idx < num_clients)
      metrics["clients"] = idx
      return new_server, client_states, metrics
    if masked:
      client_states = jax.tree.map(lambda pool, new: pool.at[idx].set(new, mode="drop"),
                                   client_states, new_cstates)
      metrics["cohort_size"] = jnp.sum(idx < num_clients)
    else:
      client_states = jax.tree.map(lambda pool, new: pool.at[idx].set(new),
                                   client_states, new_cstates)
    metrics["clients"] = idx
    return new_server, client_states, metrics

  def sample_fn(round_, key):  # the cohort of round ``round_`` (0-based server round)
    return parts.sample(_RoundOnly(jnp.asarray(round_, jnp.int32)), key)[0]

  if form != "lax":  # every trace of the round (and its retraces) sees the form
    traced = round_fn

    def round_fn(*args):
      with strategy_lib.conv_form(form):
        return traced(*args)
  round_fn.strategy = strategy
  round_fn.conv_form = form
  round_fn.execution = strategy + (strategy_lib.PATCHES if form == "patches" else "")
  round_fn.chunk_size = (strategy_lib.largest_divisor_at_most(slots, chunk)
                         if strategy == "chunked" else None)
  round_fn.sample = sample_fn
  round_fn.slots = slots
  if not jit:
    return round_fn
  jitted = jax.jit(round_fn, donate_argnums=(1,))
  wrapper = lambda *a: jitted(*a)  # noqa: E731
  for name in ("strategy", "conv_form", "execution", "chunk_size", "slots"):
    setattr(wrapper, name, getattr(round_fn, name))
  wrapper.jitted = jitted
  wrapper.sample = jax.jit(sample_fn)
  return wrapper


def build_split_round(model, kind: str, algorithm: Algorithm, num_clients: int,
                      clients_per_round: int, unroll: int | None = None):
  """A streamed round (``build_round(streamed=True)``) cut into programs that host
  threads run at the same time, for one CPU device: XLA:CPU runs one program's small
  convolutions on its cores with little parallel work to share, and two programs side by
  side use them better (measured on 2 cores: two FEMNIST CNN trainings at once take
  0.75-0.81× the time of one after the other; a FEMNIST round, 1.81 -> 1.41 s).

  Returns ``(sample, partial, finish)``, all jitted, or None when the algorithm has a
  pre-stage or a gathered (robust) aggregator, which need the whole cohort in one
  program:

  * ``sample(round, key) -> (idx [slots], client keys, flags)``: the round's draw, as in
    ``build_round``;
  * ``partial(server, client_states, data, idx, ckeys, flags) -> (sums, new states)``:
    local training of a group of the cohort (``data``, ``client_states``: that group's
    rows, ``[G, ...]``), its lifted messages summed (``map_reduce`` 'scan');
  * ``finish(server, sums, key) -> (server, metrics)``: the server step on the sums of
    every group (``RoundParts.finish``).

  The groups' sums add up to the one-program round's up to float32 summation order.
  """
  parts = round_parts(model, kind, algorithm, num_clients, clients_per_round)
  if parts.pre_client is not None or parts.gathered:
    return None
  unroll = strategy_lib.SCAN_UNROLL if unroll is None else int(unroll)
  masked = masked_slots(algorithm)

  def partial(server, cstates, data, idx, ckeys, flags):
    rows = jnp.arange(idx.shape[0], dtype=jnp.int32)
    xs = (idx, data.n, cstates, ckeys, flags, rows)
    return map_reduce(lambda inp: parts.client(server, server.extras, data, inp), xs,
                      "scan", unroll=unroll)

  def finish(server, sums, idx, key):
    new_server, metrics = parts.finish(server, server.extras, sums, key)
    if masked:
      metrics["cohort_size"] = jnp.sum(idx < num_clients)
    metrics["clients"] = idx
    return new_server, metrics

  def sample(round_, key):
    return parts.sample(_RoundOnly(jnp.asarray(round_, jnp.int32)), key)
  return jax.jit(sample), jax.jit(partial), jax.jit(finish)


class _RoundOnly(NamedTuple):
  """What a round's sampler reads of the server state: its round counter."""
  round: Any


class RoundParts(NamedTuple):
  """The phases of one round (message protocol in ``core/algorithm.py``), shared by every
  execution strategy: the jitted round of :func:`build_round` composes them with
  :func:`map_reduce`; the benchmarks' ``LoopRound`` (``fedjax_inv.benchmarks.loop_round``)
  compiles them one by one and loops in Python.

  ``inp = (i, n, cs, k, flags[, r])``: a sampled client's pool index (int32), its size
  (int32), its persistent state (no client axis: ``{component: state}``, plus
  ``CLIENT_OPT_STATE``: its client-chain state when
  ``client_optimizer_state='persistent'``), its key and its round flags (``{}``, or
  ``{'attacker': bool}`` under an attack), and optionally the row of ``data`` holding
  its examples (default: row ``i``, or ``N - 1`` for an empty slot; a streamed cohort
  passes its slot).
    sample(server, key) -> (idx [C] int32, ckeys [C] keys, flags {name: [C]});
    pre_client(server, data, inp) -> {component: lifted pre-stage message} (None when no
      component has a pre-stage);
    pre_finish(server, pre_sums) -> extras (the components' server states after pre_update);
    client(server, extras, data, inp) -> (stats, new client state): local training, the
      lifted pseudo-gradient ``'__main__'``, the weighted loss ``'__loss__'`` and each
      component's lifted message;
    finish(server, extras, sums) -> (new ServerState, {'train_loss': scalar});
    gathered: the ``stats`` keys whose values are stacked ``[C, ...]`` instead of summed
      (gathered aggregators, ``core/aggregator.py``; ``'__attacker__'`` under an attack).
  """
  sample: Callable
  pre_client: Callable | None
  pre_finish: Callable
  client: Callable
  finish: Callable
  gathered: tuple = ()


def server_side(stage_comps, server_opt, server, extras, pseudo_grad, messages, ctx):
  """The server's step after aggregation: the components' server stages in component
  order (a function stage updates its component's server state in ``extras``; an optax
  stage its own state in ``opt_state``), then the server optimizer; stages and optimizer
  see the aggregated client ``messages`` and the round's ``ctx``. Returns ``(updates,
  opt_state, extras)``."""
  extras, opt_state = dict(extras), dict(server.opt_state)
  for c in stage_comps:
    if is_optax(c.server_stage):
      pseudo_grad, opt_state[c.name] = c.server_stage.update(
          pseudo_grad, opt_state[c.name], server.params)
    else:
      pseudo_grad, state = c.call("server_stage", pseudo_grad=pseudo_grad, messages=messages,
                                  state=extras.get(c.name), ctx=ctx)
      if c.init_server is not None:  # a stage without server state keeps none
        extras[c.name] = state
  updates, opt_state["server_optimizer"] = server_opt.update(
      pseudo_grad, opt_state["server_optimizer"], server.params, messages=messages, ctx=ctx)
  return updates, opt_state, extras


def masked_slots(algorithm: Algorithm) -> bool:
  """Whether a round's cohort can hold empty slots (pool index ``N``, weight 0): Poisson
  sampling, or participation that leaves clients out (``core/adversary.py``)."""
  part = algorithm.participation
  return algorithm.client_sampling == "poisson" or (part is not None and part.masks_slots)


def finalize_with_key(agg: Aggregator, stats, ctx):
  """``agg.finalize(stats)``, with the round's server key for one that needs it."""
  if getattr(agg.finalize, "needs_key", False):
    return agg.finalize(stats, key=ctx.key if ctx.key is not None else jax.random.key(0))
  return agg.finalize(stats)


def make_sampler(algorithm: Algorithm, num_clients: int, clients_per_round: int):
  """``sample(server, key) -> (idx [slots] int32, client keys, flags)`` of a round: fixed
  or Poisson sampling, or the online clients (``participation.availability``); dropped-out
  clients and dropped stragglers become empty slots (index ``N``); ``flags['attacker']``
  marks the malicious slots under an attack (``core/adversary.py``)."""
  attack, part = algorithm.attack, algorithm.participation
  slots = cohort_slots(algorithm, num_clients, clients_per_round)

  def sample(server, key):
    k_sample, k_clients = jax.random.split(jax.random.fold_in(key, server.round))
    if algorithm.client_sampling == "poisson":
      idx = poisson_sample(k_sample, num_clients, clients_per_round / num_clients, slots)
    elif part is not None and part.availability < 1.0:
      idx = adversary.available_sample(k_sample, num_clients, clients_per_round,
                                       part.availability)
    else:
      idx = jax.random.choice(k_sample, num_clients, (clients_per_round,), replace=False)
    ckeys = jax.vmap(lambda i: jax.random.fold_in(k_clients, i))(idx)
    if part is not None and part.dropout > 0.0:  # a selected client never returns
      gone = jax.random.uniform(jax.random.fold_in(k_sample, 0xD209), idx.shape) < part.dropout
      idx = jnp.where(gone, num_clients, idx)
    if part is not None and part.stragglers > 0.0 and part.straggler_mode == "drop":
      slow = jax.vmap(lambda k: adversary.straggler_steps(k, 2, part.stragglers)[0])(ckeys)
      idx = jnp.where(slow, num_clients, idx)  # FedAvg drops the stragglers
    flags = {}
    if attack is not None:
      bad = adversary.attackers(key, num_clients, attack.fraction)
      flags["attacker"] = jnp.where(idx < num_clients, bad[jnp.minimum(idx, num_clients - 1)],
                                    False)
    return idx, ckeys, flags
  return sample


def aggregate_updates(main_agg: Aggregator, attack, sums: dict, traced: dict, ctx,
                      cohort: int):
  """The pseudo-gradient from the round's sums: ``main_agg.finalize`` of ``'__main__'``,
  after an attack rewrote the stacked updates (gather path), with a sweep replica's
  traced values and the round's server key (``ctx.key``) where the aggregator takes
  them."""
  key = ctx.key if ctx.key is not None else jax.random.key(0)
  main = sums["__main__"]
  if attack is not None and main_agg.gather:  # the attackers' updates, replaced
    msgs, w = main
    main = (adversary.apply_attack(attack, msgs, w > 0, sums["__attacker__"], key, cohort), w)
  kw = {}
  if traced and traced_names(main_agg):  # a sweep replica's traced tau
    kw["hparams"] = traced
  if getattr(main_agg.finalize, "needs_key", False):
    kw["key"] = key
  return main_agg.finalize(main, **kw)


def client_schedule(algorithm: Algorithm, masked: bool, present, n, ctx, key):
  """``(n, ctx, cap)`` of a client: under ``local_epochs`` its own step count in
  ``ctx.local_steps`` (an empty slot: ``n = 0``, no step); a kept straggler's step count
  ``cap`` (``core/adversary.py``, also in ``ctx.local_steps``), else ``cap = None``."""
  if algorithm.local_epochs is not None:
    if masked:  # an empty slot (weight 0) runs no step
      n = jnp.where(present, n, 0)
    ctx = ctx.replace(local_steps=client_steps(algorithm, n))
  part, cap = algorithm.participation, None
  if part is not None and part.stragglers > 0.0 and part.straggler_mode == "keep":
    full = (ctx.local_steps if ctx.local_steps is not None
            else jnp.int32(algorithm.local_steps))
    cap = adversary.straggler_steps(key, full, part.stragglers)[1]
    ctx = ctx.replace(local_steps=cap)
  return n, ctx, cap


def round_parts(model, kind: str, algorithm: Algorithm, num_clients: int,
                clients_per_round: int) -> RoundParts:
  """The round's phases for ``algorithm`` on pool size ``N = num_clients`` and cohort
  ``C = clients_per_round`` (see :class:`RoundParts`). Pure functions, not jitted."""
  comps = algorithm.components
  pre_comps = [c for c in comps if c.pre_message is not None]
  after_comps = [c for c in comps if c.message is not None or c.update_client is not None]
  msg_comps = [c for c in comps if c.message is not None]
  stage_comps = [c for c in comps if c.server_stage is not None]
  mean_agg = weighted_mean()
  server_opt = optax.with_extra_args_support(algorithm.server_optimizer)
  persistent = algorithm.client_optimizer_state == "persistent"
  masked = masked_slots(algorithm)
  attack = algorithm.attack
  main_agg = main_aggregator(algorithm)
  gathered = tuple(["__main__", *(["__attacker__"] if attack is not None else [])]
                   if main_agg.gather else []) + tuple(
      c.name for c in msg_comps if getattr(c.aggregator, "gather", False))

  def split_state(cs):
    """A client's pool state -> (its components' states, its client-chain state or None)."""
    if (CLIENT_OPT_STATE in cs) != persistent:
      raise ValueError(
          f"client_states {'has no' if persistent else 'has a'} {CLIENT_OPT_STATE!r} entry "
          f"but the algorithm runs client_optimizer_state="
          f"{algorithm.client_optimizer_state!r}; build the states with "
          "init_state(algorithm, ...) of this algorithm.")
    return {k: v for k, v in cs.items() if k != CLIENT_OPT_STATE}, cs.get(CLIENT_OPT_STATE)

  def weight_of(n, i):
    w = (jnp.ones((), jnp.float32) if algorithm.weighting == "uniform"
         else n.astype(jnp.float32))
    if masked:  # an empty slot of the cohort buffer (index N) weighs 0
      w = jnp.where(i < num_clients, w, jnp.zeros_like(w))
    return w

  def row(i):  # the pool row of slot index i (an empty slot reads row N-1)
    return jnp.minimum(i, num_clients - 1) if masked else i

  def lifted(agg, message, w, i, ctx=None):
    """``agg.lift`` (given the client's ``ctx`` when it reads it); an empty Poisson slot
    lifts to zeros (the sums' identity), whatever the aggregator does with a weight of 0."""
    stats = lift(agg, message, w, ctx)
    if masked:
      stats = jax.tree.map(lambda a: jnp.where(i < num_clients, a, jnp.zeros_like(a)),
                           stats)
    return stats

  def ctx_of(server, extras, cs=None):
    return client_context(server.params, server.round, extras, {} if cs is None else cs,
                          num_clients, clients_per_round)

  sample = make_sampler(algorithm, num_clients, clients_per_round)

  def data_row(inp):  # the slot's data row (engine: inp[5]); the pool row otherwise
    return inp[5] if len(inp) > 5 else row(inp[0])

  def pre_client(server, data, inp):
    i, n, cs, k = inp[:4]
    ctx = ctx_of(server, dict(server.extras), split_state(cs)[0])
    r = data_row(inp)
    batch = full_batch(data.x[r], data.y[r], n)
    w = weight_of(n, i)
    return {c.name: lifted(c.pre_aggregator or mean_agg, c.call(
        "pre_message", model=model, kind=kind, params=server.params, batch=batch, ctx=ctx,
        key=jax.random.fold_in(k, 1)), w, i) for c in pre_comps}

  def pre_finish(server, pre_sums):
    extras = dict(server.extras)
    for c in pre_comps:  # each pre_update sees the states updated before it
      agg = (c.pre_aggregator or mean_agg).finalize(pre_sums[c.name])
      extras[c.name] = c.call("pre_update", aggregate=agg, state=extras.get(c.name),
                              ctx=ctx_of(server, extras))
    return extras

  def client(server, extras, data, inp):
    i, n, cs, k, flags = inp[:5]
    r = data_row(inp)
    x, y = data.x[r], data.y[r]
    if attack is not None and attack.name == "label_flip":  # data poisoning
      y = jnp.where(flags["attacker"], adversary.flip_labels(y, attack.num_classes), y)
    comp_cs, opt_state = split_state(cs)
    ctx = ctx_of(server, extras, comp_cs)
    n, ctx, cap = client_schedule(algorithm, masked, i < num_clients, n, ctx, k)
    k_train, k_msg = jax.random.split(k)
    params, step_losses, opt_state = local_train(model, kind, algorithm, ctx, x, y, n,
                                                 k_train, opt_state, steps=cap)
    delta = jax.tree.map(jnp.subtract, server.params, params)
    w = weight_of(n, i)
    stats = {"__main__": lifted(main_agg, delta, w, i, ctx),
             "__loss__": (jnp.where(w > 0, w * mean_step_loss(step_losses, algorithm, n,
                                                              ctx.local_steps), 0.0), w)}
    if attack is not None and main_agg.gather:
      stats["__attacker__"] = flags["attacker"]
    new_cs = dict(cs)
    batch = full_batch(x, y, n)
    for c in after_comps:
      msg, new_state = client_outputs(model, kind, c, params, batch, ctx, k_msg)
      if c.message is not None:
        stats[c.name] = lifted(c.aggregator or mean_agg, msg, w, i, ctx)
      if c.update_client is not None and c.name in cs:
        new_cs[c.name] = new_state
    if persistent:  # the client keeps its optimizer state for its next round
      new_cs[CLIENT_OPT_STATE] = opt_state
    return stats, new_cs

  def finish(server, extras, sums, key=None):
    ctx_b = ctx_of(server, extras)
    if key is not None:  # the server side's key of this round (e.g. DP noise)
      ctx_b = ctx_b.replace(key=server_key(key, server.round))
    traced = server.extras.get(HPARAMS, {})
    pseudo_grad = aggregate_updates(main_agg, attack, sums, traced, ctx_b,
                                    clients_per_round)
    messages = {c.name: finalize_with_key(c.aggregator or mean_agg, sums[c.name], ctx_b)
                for c in msg_comps}
    updates, opt_state, extras = server_side(stage_comps, server_opt, server, extras,
                                             pseudo_grad, messages, ctx_b)
    new_server = ServerState(params=optax.apply_updates(server.params, updates),
                             opt_state=opt_state, round=server.round + 1, extras=extras)
    loss_sum, wsum = sums["__loss__"]  # 0 (not NaN) if no sampled client has weight
    return new_server, {"train_loss": loss_sum / jnp.where(wsum > 0, wsum, 1.0)}

  return RoundParts(sample, pre_client if pre_comps else None, pre_finish, client, finish,
                    gathered)
