"""Issue 13: fused rounds (`simulation.run(rounds_per_call=R)`, R rounds in one device call
under a `lax.fori_loop`) give the same history, parameters and client states as one call
per round, and still stop a diverging run at its first non-finite round."""
import chex
import numpy as np
import pytest

from fedjax_inv import Task
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner import simulation


def _task(tiny_binary):
  data, model = tiny_binary
  return Task("tiny", "binary", data, {"ood": data.take(np.array([0, 3]))}, model, {})


@pytest.mark.parametrize("name,hp", [
    ("fedavg", {}),
    ("scaffold", {}),                # per-client control variates (client states)
    ("fedgma", {"tau": 0.4}),         # server-side sign mask
])
@pytest.mark.slow
def test_fused_rounds_equal_per_round_calls(tiny_binary, name, hp):
  task = _task(tiny_binary)
  alg = make_algorithm(name, client_lr=0.1, local_steps=2, batch_size=8, **hp)
  kw = dict(rounds=17, clients_per_round=3, eval_every=5, seed=2, progress=False,
            reporting={"select": ["min:ood_loss"], "last_k": 3})
  ref = simulation.run(task, alg, **kw)
  fused = simulation.run(task, alg, rounds_per_call=6, **kw)
  assert fused.history == ref.history  # exact floats at rounds 5, 10, 15, 16, 17
  chex.assert_trees_all_equal(fused.server_state, ref.server_state)
  assert fused.selected == ref.selected and fused.last_k_mean == ref.last_k_mean


def test_fused_rounds_report_the_first_non_finite_round(tiny_binary):
  alg = make_algorithm("fedavg", client_lr=1e30, local_steps=3, batch_size=8)
  kw = dict(rounds=50, eval_every=50, progress=False, reporting=None)
  with pytest.raises(simulation.DivergedError) as ref:
    simulation.run(_task(tiny_binary), alg, **kw)
  with pytest.raises(simulation.DivergedError) as fused:
    simulation.run(_task(tiny_binary), alg, rounds_per_call=8, **kw)
  assert fused.value.round == ref.value.round < 50


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_rounds_per_call_below_one_is_refused(tiny_binary, bad):
  alg = make_algorithm("fedavg")
  with pytest.raises(ValueError, match="rounds_per_call"):
    simulation.run(_task(tiny_binary), alg, rounds=3, rounds_per_call=bad, progress=False)
