"""FedSR's representation head sits where the paper / official code put it (issue 10,
item 1) and FedSR averages clients with a plain mean (item 2).

FedSR §4.2 / §5 and the official ``methods/base.py``: the backbone's last layer becomes
``Linear(in, 2·z_dim)`` producing (μ, pre-σ); z is the 64-d (RotatedMNIST ConvNet),
512-d (ResNet-18) or 2048-d (ResNet-50) representation itself, with no extra layer.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv import models
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.algorithms.fedsr import fedsr_model
from fedjax_inv.models import resnet as R


def shapes(tree):
  return jax.tree.map(lambda a: tuple(a.shape), tree)


def abstract_init(model):
  return jax.eval_shape(lambda: model.init(0))


def test_convnet_is_fedsrs_rotated_mnist_network():
  m = models.convnet()
  p = abstract_init(m)
  # two 3×3 convs (1→32→64), FC 64·5·5 → 64 (28→26→13→11→5), linear classifier 64 → 10.
  assert shapes(p) == {
      "featurizer": {"conv1": {"kernel": (3, 3, 1, 32), "bias": (32,)},
                     "conv2": {"kernel": (3, 3, 32, 64), "bias": (64,)},
                     "projection": {"kernel": (1600, 64), "bias": (64,)}},
      "classifier": {"kernel": (64, 10), "bias": (10,)}}
  assert m.feature_dim == 64
  x = jnp.zeros((3, 28, 28, 1))
  assert m.apply(m.init(0), x).shape == (3, 10)


@pytest.mark.parametrize("name", ["fedsr", "fedcmi"])
def test_fedsr_on_convnet_replaces_the_projection(name):
  base = models.convnet()
  m = make_algorithm(name).model_for(base)
  p = abstract_init(m)
  feat = shapes(p["featurizer"])
  assert set(feat) == {"conv1", "conv2", "projection"}       # no extra layer
  assert feat["projection"]["kernel"] == (1600, 128)          # (μ, pre-σ), z_dim = 64
  assert shapes(p["classifier"])["kernel"] == (64, 10)
  assert shapes(p["reference"]) == {"mu": (10, 64), "sigma_raw": (10, 64)}
  assert m.feature_dim == 64


def test_mu_and_sigma_come_from_the_one_projection_of_the_trunk():
  """μ = trunk(x) W[:, :z] + b[:z]; σ = softplus(trunk(x) W[:, z:] + b[z:]) (+ floor)."""
  from fedjax_inv.algorithms.fedsr import gaussian_params
  m = fedsr_model(models.convnet(z_dim=6))
  p = m.init(1)
  x = jax.random.uniform(jax.random.key(0), (4, 28, 28, 1))
  trunk = m._merge(p).featurizer.trunk(x)                  # [4, 1600], convs only
  w, b = p["featurizer"]["projection"]["kernel"], p["featurizer"]["projection"]["bias"]
  h = np.asarray(trunk @ w + b)
  mu, sigma = gaussian_params(m, p, x, sigma_min=1e-5)
  np.testing.assert_allclose(np.asarray(mu), h[:, :6], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(sigma), np.logaddexp(0, h[:, 6:]) + 1e-5,
                             rtol=1e-4, atol=1e-5)


def test_fedl2r_keeps_the_task_models_shapes():
  """Deterministic head with z_dim = the projection's size: the same architecture as the
  task model (official FedL2R: ``net.fc = Linear(in, z_dim)``)."""
  base = models.convnet()
  assert shapes(abstract_init(make_algorithm("fedl2r").model_for(base))) == \
      shapes(abstract_init(base))


@pytest.mark.parametrize("depth,trunk,z", [(18, 8 * 4, 512), (50, 8 * 4 * 4, 2048)])
@pytest.mark.slow
def test_fedsr_on_resnet_uses_the_512_or_2048_projection_as_z(depth, trunk, z):
  base = R.resnet(depth, 7, base_width=4)
  m = make_algorithm("fedsr").model_for(base)
  p = shapes(abstract_init(m))
  assert p["featurizer"]["projection"]["kernel"] == (trunk, 2 * z)
  assert p["classifier"]["kernel"] == (z, 7)
  assert p["reference"]["mu"] == (7, z)
  assert m.feature_dim == z
  # Everything but the projection is the task model's featurizer, unchanged.
  bp = shapes(abstract_init(base))
  assert {k: v for k, v in p["featurizer"].items() if k != "projection"} == \
      {k: v for k, v in bp["featurizer"].items() if k != "projection"}
  if depth == 18:  # FedL2R: deterministic z, the task model's own shapes
    assert shapes(abstract_init(make_algorithm("fedl2r").model_for(base))) == bp
  # z_dim can still be set explicitly.
  p2 = shapes(abstract_init(make_algorithm("fedsr", z_dim=16).model_for(base)))
  assert p2["featurizer"]["projection"]["kernel"] == (trunk, 32)


def test_models_without_projection_get_an_appended_layer_of_their_width():
  base = models.mlp(5, (8,), 3)
  p = shapes(abstract_init(make_algorithm("fedsr").model_for(base)))
  assert p["featurizer"]["layers"][1]["kernel"] == (8, 16)      # appended Linear(d, 2d)
  assert p["classifier"]["kernel"] == (8, 3)


def test_pretrained_featurizer_survives_the_fedsr_head(tmp_path):
  base = R.resnet18(3, base_width=4, small_input=True)
  ref = base.init(7)
  ref["featurizer"]["stem_conv"]["kernel"] = ref["featurizer"]["stem_conv"]["kernel"] + 1.0
  path = R.save_params({"featurizer": ref["featurizer"]}, tmp_path / "w.npz")
  pre = R.with_pretrained(base, path)
  p = make_algorithm("fedsr").model_for(pre).init(0)
  np.testing.assert_array_equal(np.asarray(p["featurizer"]["stem_conv"]["kernel"]),
                                np.asarray(ref["featurizer"]["stem_conv"]["kernel"]))
  np.testing.assert_array_equal(np.asarray(p["featurizer"]["blocks"][3]["conv2"]["kernel"]),
                                np.asarray(ref["featurizer"]["blocks"][3]["conv2"]["kernel"]))
  assert p["featurizer"]["projection"]["kernel"].shape == (32, 1024)   # the new head
  # Without pretrained weights nothing is copied from another init.
  fresh = make_algorithm("fedsr").model_for(base).init(0)
  assert not np.allclose(np.asarray(fresh["featurizer"]["stem_conv"]["kernel"]),
                         np.asarray(ref["featurizer"]["stem_conv"]["kernel"]))


@pytest.mark.parametrize("name", ["fedsr", "fedl2r", "fedcmi"])
def test_server_mean_is_uniform_by_default_and_size_weighting_is_an_option(name):
  assert make_algorithm(name).weighting == "uniform"
  assert make_algorithm(name).hparams["weighting"] == "uniform"
  assert make_algorithm(name, weighting="num_examples").weighting == "num_examples"
  with pytest.raises(ValueError, match="weighting"):
    make_algorithm(name, weighting="size")
