"""Client and server stages (issues 14, 22): a component's ``client_stage`` runs before the
client optimizer, its ``server_stage`` before the server optimizer, in component order.
A stage is a plain function (a server stage updates the component's own server state,
``init_server``, the only home clients read) or, when it needs no messages, any optax
transformation."""
import chex
import jax
import jax.numpy as jnp
import optax
import pytest

from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core.algorithm import Component, client_stage
from fedjax_inv.core.engine import build_round, init_state
from tests.trees import max_abs_diff


def _rounds(alg, data, model, rounds=2):
  rf = build_round(model, "binary", alg, data.num_clients, data.num_clients,
                   execution="scan")
  server, cs = init_state(alg, model.init(0), data.num_clients)
  for _ in range(rounds):
    server, cs, _ = rf(server, cs, data, jax.random.key(3))
  return server


def _close(a, b, rtol=1e-5, atol=1e-7):
  chex.assert_trees_all_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [
    optax.scale(0.5),  # an ordinary optax transformation, usable outside the engine
    lambda pseudo_grad, state: (jax.tree.map(lambda g: 0.5 * g, pseudo_grad), state)])
def test_a_server_stage_scaling_the_pseudo_gradient_equals_a_smaller_server_lr(
    tiny_binary, stage):
  """stage 0.5, then sgd(1) = sgd(0.5): the stage runs before the server optimizer."""
  data, model = tiny_binary
  kw = dict(client_lr=0.1, local_steps=2, batch_size=8)
  staged = make_algorithm("fedavg", **kw).with_component(Component("half", server_stage=stage))
  assert list(staged.server_optimizer_state(model.init(0))) == (
      ["half", "server_optimizer"] if isinstance(stage, optax.GradientTransformation)
      else ["server_optimizer"])
  _close(_rounds(staged, data, model).params,
         _rounds(make_algorithm("fedavg", server_lr=0.5, **kw), data, model).params)
  # ... and it did something: the full step differs.
  full = _rounds(make_algorithm("fedavg", **kw), data, model).params
  assert max_abs_diff(full, _rounds(staged, data, model).params) > 1e-5


@pytest.mark.parametrize("stage", [
    lambda grads: jax.tree.map(lambda a: 2.0 * a, grads),  # a function of what it reads
    optax.scale(2.0)])  # or an optax transformation
def test_a_client_stage_runs_before_the_client_optimizer(tiny_binary, stage):
  """A client stage doubling the gradient = the client optimizer at twice the rate (SGD)."""
  data, model = tiny_binary
  staged = make_algorithm("fedavg", client_lr=0.05, local_steps=3,
                          batch_size=8).with_component(Component("double", client_stage=stage))
  assert list(staged.client_chain().init(model.init(0))) == ["double", "client_optimizer"]
  _close(_rounds(staged, data, model).params,
         _rounds(make_algorithm("fedavg", client_lr=0.1, local_steps=3, batch_size=8),
                 data, model).params, rtol=1e-4, atol=1e-6)


def test_scaffold_control_variate_is_its_server_state(tiny_binary):
  """SCAFFOLD's server c lives once, in its component server state (extras['scaffold'],
  what clients read); with the whole pool sampled it is the uniform mean of the clients'
  c_i after each round (Alg. 1, |S| = N)."""
  data, model = tiny_binary
  alg = make_algorithm("scaffold", client_lr=0.1, local_steps=3, batch_size=8)
  rf = build_round(model, "binary", alg, data.num_clients, data.num_clients,
                   execution="vmap")
  server, cs = init_state(alg, model.init(0), data.num_clients)
  assert list(server.opt_state) == ["server_optimizer"]
  for _ in range(2):
    server, cs, _ = rf(server, cs, data, jax.random.key(0))
  mean_ci = jax.tree.map(lambda a: jnp.mean(a, axis=0), cs["scaffold"])
  _close(server.extras["scaffold"], mean_ci, rtol=1e-4, atol=1e-6)
  assert max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(mean_ci)) > 1e-4


def test_stage_errors_name_the_fix(tiny_binary):
  with pytest.raises(TypeError, match="ctx="):
    client_stage(lambda grads, ctx: grads).update({"a": jnp.ones(2)}, optax.EmptyState(), None)
  base = make_algorithm("fedavg")
  with pytest.raises(TypeError, match="server_stage must be a function or an optax"):
    base.with_component(Component("bad", server_stage=3))
  with pytest.raises(TypeError, match="client_stage must be a function or an optax"):
    base.with_component(Component("bad", client_stage="scale"))
  with pytest.raises(ValueError, match="names the server optimizer"):
    base.with_component(Component("server_optimizer"))
  with pytest.raises(ValueError, match="has no init_server"):
    base.with_component(Component("p", pre_message=lambda **_: 0.0,
                                  pre_update=lambda state, aggregate: state))


def test_a_hook_reads_the_arguments_it_names():
  """Hooks read their arguments by name: each gets exactly the ones it declares (a
  ``**kwargs`` hook gets all of its hook's), and a name its hook does not provide is
  refused when the component is built, naming the hook, the name and the ones there
  are."""
  seen = {}

  def message(params, ctx):
    seen["message"] = (params, ctx)
    return 1.0

  def loss(**arguments):
    seen["loss"] = sorted(arguments)
    return 0.0

  comp = Component("c", message=message, loss=loss)
  view = dict(model="m", kind="binary", params="p", batch="b", ctx="x", key="k")
  assert comp.call("message", **view) == 1.0 and seen["message"] == ("p", "x")
  comp.call("loss", fwd="f", **view)
  assert seen["loss"] == sorted([*view, "fwd"])
  with pytest.raises(TypeError, match=r"component 'bad': loss hook '<lambda>' has a "
                     r"parameter 'w'.*\('model', 'kind', 'params', 'batch', 'ctx', 'key', "
                     r"'fwd'\)"):
    Component("bad", loss=lambda w, ctx: 0.0)
  with pytest.raises(TypeError, match="parameter 'p'"):
    Component("bad", init_server=lambda p: p)
  with pytest.raises(TypeError, match=r"takes \*args, but hooks get their arguments by name"):
    Component("bad", message=lambda *args: args[0])
  with pytest.raises(ValueError, match="'losses' is not a hook"):
    comp.call("losses")
  with pytest.raises(ValueError, match="has no forward function"):
    comp.call("forward", model="m", params="p", batch="b", key="k")


def test_changing_local_steps_after_building_is_refused():
  """SCAFFOLD's control update is built for K local steps: .replace(local_steps=...) would
  keep the old K (and the run's summary would record it), so it must be refused."""
  alg = make_algorithm("scaffold", client_lr=0.1, local_steps=3, batch_size=8)
  with pytest.raises(ValueError, match="build it anew"):
    alg.replace(local_steps=5)
  assert make_algorithm("scaffold", client_lr=0.1, local_steps=5).local_steps == 5
