"""The state a round starts from: the server's (``ServerState``) and every pool client's
(``client_states``), created by :func:`init_state` from an ``Algorithm``'s description.
Shared by the engine (``core/engine.py``) and the memory estimate (``core/memory.py``)."""
from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp

from fedjax_inv.core.algorithm import CLIENT_OPT_STATE, Algorithm

PyTree = Any


@chex.dataclass
class ServerState:
  """Server state: ``params`` (global model ``w_t``), ``opt_state``
  (``Algorithm.server_optimizer_state``: the server optimizer's and the optax server
  stages'), ``round`` (int32 scalar), ``extras`` ({component name: its server state,
  ``init_server``}, what clients read as ``ctx.extras``)."""
  params: PyTree
  opt_state: PyTree
  round: chex.Array
  extras: dict


def init_state(algorithm: Algorithm, params: PyTree, num_clients: int):
  """Initial ``(ServerState, client_states)``.

  ``client_states`` is ``{component name: pytree with leading pool axis [N, ...]}`` for
  every component with per-client state (SCAFFOLD's control variates, FedCurv's Fisher),
  plus, when ``algorithm.client_optimizer_state == 'persistent'``,
  ``{CLIENT_OPT_STATE: algorithm.client_chain().init(params)}`` stacked ``[N, ...]``
  (every client's optimizer created once at the initial global ``params``, as FedSR's
  official code does; ``CLIENT_OPT_STATE = '__client_optimizer__'``). Being part of
  ``client_states``, it is carried by every execution strategy, replica batch and
  checkpoint like the components' state.
  """
  extras = {c.name: c.call("init_server", params=params) for c in algorithm.components
            if c.init_server is not None}
  opt_state = algorithm.server_optimizer_state(params)
  server = ServerState(params=params, opt_state=opt_state,
                       round=jnp.zeros((), jnp.int32), extras=extras)
  client_states = {}
  for c in algorithm.components:
    if c.init_client is not None:
      one = c.call("init_client", params=params)
      client_states[c.name] = jax.tree.map(
          lambda a: jnp.broadcast_to(a, (num_clients,) + jnp.shape(a)).copy(), one)
  if algorithm.client_optimizer_state == "persistent":
    one = algorithm.client_chain().init(params)
    client_states[CLIENT_OPT_STATE] = jax.tree.map(
        lambda a: jnp.broadcast_to(a, (num_clients,) + jnp.shape(a)).copy(), one)
  return server, client_states
