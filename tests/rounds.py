"""Running the engine's jitted round directly in tests (no simulation loop, evaluation or
checkpoints): the side of an engine-vs-reference comparison that the engine computes."""
import jax

from fedjax_inv.core.engine import build_round, init_state


def run_rounds(alg, data, model, strategy: str, rounds: int, cohort: int,
               kind: str = "multiclass", chunk_size: int = 2, seed: int = 0):
  """``rounds`` rounds of ``alg`` on ``data`` from ``model.init(seed)`` with the engine's
  ``strategy``, every round keyed by ``jax.random.key(seed)`` (the round counter in the
  server state varies the draws). Returns ``(global params, client states)``."""
  rf = build_round(model, kind, alg, data.num_clients, cohort, execution=strategy,
                   chunk_size=chunk_size)
  server, cs = init_state(alg, model.init(seed), data.num_clients)
  for _ in range(rounds):
    server, cs, _ = rf(server, cs, data, jax.random.key(seed))
  return server.params, cs
