"""docs/ALGORITHMS.md, 'Writing an algorithm' (issue 22): the SCAFFOLD written there with
six concepts runs, and trains to the registered ``scaffold``'s numbers."""
import ast
import pathlib
import re

import chex
import jax
import pytest

import fedjax_inv as fi
from fedjax_inv.core import algorithm as algorithm_lib
from fedjax_inv.core.engine import build_round, init_state

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "ALGORITHMS.md"
# The six concepts the section names (and the decorator / factory they come with).
CONCEPTS = {"Component", "Batch", "Context", "uniform_mean", "build", "register"}


def _example() -> str:
  text = DOC.read_text()
  m = re.search(r"<!-- example: my_scaffold -->\n```python\n(.*?)```", text, re.S)
  assert m, "docs/ALGORITHMS.md lost its '<!-- example: my_scaffold -->' code block"
  return m.group(1)


def test_the_example_uses_only_the_six_concepts_of_the_package():
  """Every name the example takes from fedjax_inv is one of the six concepts."""
  used = {node.attr for node in ast.walk(ast.parse(_example()))
          if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id == "fi"}
  assert used <= CONCEPTS, used - CONCEPTS
  assert len(CONCEPTS) <= 6


@pytest.fixture
def fresh_registry(monkeypatch):
  """The example registers 'my_scaffold': register it in a copy of the registry."""
  monkeypatch.setattr(algorithm_lib, "_REGISTRY", dict(algorithm_lib._REGISTRY))


def _rounds(alg, data, model, rounds=3):
  rf = build_round(model, "binary", alg, data.num_clients, 3, execution="scan")
  server, cs = init_state(alg, model.init(0), data.num_clients)
  for _ in range(rounds):
    server, cs, _ = rf(server, cs, data, jax.random.key(5))
  return server, cs


def test_the_documented_scaffold_equals_the_registered_one(tiny_binary, fresh_registry):
  exec(compile(_example(), str(DOC), "exec"), {"__name__": "doc_example"})
  data, model = tiny_binary
  kw = dict(client_lr=0.1, local_steps=3, batch_size=8)
  mine = fi.make_algorithm("my_scaffold", **kw)
  ref = fi.make_algorithm("scaffold", **kw)
  (s1, c1), (s2, c2) = _rounds(mine, data, model), _rounds(ref, data, model)
  chex.assert_trees_all_close(s1.params, s2.params, rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(s1.extras["cv"], s2.extras["scaffold"], rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(c1["cv"], c2["scaffold"], rtol=1e-6, atol=1e-7)
  # ... and the control variates did something: FedAvg with the same knobs differs.
  s3, _ = _rounds(fi.make_algorithm("fedavg", weighting="uniform", **kw), data, model)
  diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(abs(a - b).max()), s1.params,
                                       s3.params))
  assert max(diffs) > 1e-5
