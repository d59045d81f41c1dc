"""models.conv.conv_general_dilated: same values and gradients as lax, canonical layout."""
import re

import jax
import jax.numpy as jnp
import chex
import numpy as np
import pytest
from jax import lax

from fedjax_inv import models
from fedjax_inv.models.conv import conv_general_dilated

NHWC = ("NHWC", "HWIO", "NHWC")
CASES = [
    ((2, 9, 9, 3), (3, 3, 3, 4), (1, 1), "SAME", None, NHWC),
    ((2, 9, 9, 3), (3, 3, 3, 4), (2, 2), "SAME", None, NHWC),
    ((2, 10, 9, 3), (3, 2, 3, 4), (2, 3), "VALID", None, NHWC),
    ((2, 10, 9, 3), (3, 3, 3, 4), (2, 1), [(1, 2), (0, 1)], (2, 1), NHWC),
    ((2, 3, 9, 9), (4, 3, 3, 3), (1, 2), "SAME", None, ("NCHW", "OIHW", "NCHW")),
    ((2, 3, 11), (4, 3, 5), (2,), "SAME", None, None),
    ((2, 9, 9, 3), (7, 7, 3, 4), (2, 2), [(3, 3), (3, 3)], None, NHWC),
]


@pytest.mark.parametrize("xs,ws,strides,pad,rhs_dil,dn", CASES)
@pytest.mark.slow
def test_value_and_vjp_equal_lax(xs, ws, strides, pad, rhs_dil, dn):
  k1, k2, k3 = jax.random.split(jax.random.key(len(xs) + sum(ws)), 3)
  x, w = jax.random.normal(k1, xs), jax.random.normal(k2, ws)

  def ref(x, w):
    return lax.conv_general_dilated(x, w, strides, pad, rhs_dilation=rhs_dil,
                                    dimension_numbers=dn)

  def new(x, w):
    return conv_general_dilated(x, w, strides, pad, rhs_dilation=rhs_dil,
                                dimension_numbers=dn)

  y_ref, vjp_ref = jax.vjp(ref, x, w)
  y_new, vjp_new = jax.vjp(new, x, w)
  np.testing.assert_allclose(y_new, y_ref, rtol=1e-5, atol=1e-5)
  ct = jax.random.normal(k3, y_ref.shape)
  for a, b in zip(jax.jit(vjp_new)(ct), vjp_ref(ct)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_vmapped_over_clients_equals_per_client():
  """Per-client kernels (the engine's client axis) through vmap: gradients per client."""
  x = jax.random.normal(jax.random.key(0), (3, 2, 8, 8, 2))
  w = jax.random.normal(jax.random.key(1), (3, 3, 3, 2, 5))

  def loss(f, x, w):
    return jnp.sum(jnp.sin(f(x, w, (1, 1), "SAME", dimension_numbers=NHWC)))

  got = jax.vmap(jax.grad(lambda w, x: loss(conv_general_dilated, x, w)))(w, x)
  for c in range(3):
    want = jax.grad(lambda w: loss(lax.conv_general_dilated, x[c], w))(w[c])
    np.testing.assert_allclose(got[c], want, rtol=1e-4, atol=1e-4)


def test_fallback_for_grouped_convolutions():
  x = jax.random.normal(jax.random.key(0), (1, 6, 6, 4))
  w = jax.random.normal(jax.random.key(1), (3, 3, 2, 4))
  got = conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC,
                             feature_group_count=2)
  want = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC,
                                  feature_group_count=2)
  np.testing.assert_array_equal(got, want)


def test_gradient_convolutions_stay_canonical_inside_a_loop():
  """The point of the module: in a rolled loop of SGD steps on the ConvNet, every
  convolution XLA:CPU compiles has the canonical layout (with lax's own VJP the weight
  gradients kept ``f01b_i01o->01bf`` and ran ~50x slower on CPU)."""
  model = models.cnn(1, channels=(4, 8), num_outputs=3)
  params = model.init(0)
  x = jnp.ones((4, 8, 8, 1))

  def train(params):
    def step(p, _):
      g = jax.grad(lambda p: jnp.sum(model.apply(p, x) ** 2))(p)
      return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g), None
    return jax.lax.scan(step, params, None, length=3)[0]

  hlo = jax.jit(train).lower(params).compile().as_text()
  labels = re.findall(r"convolution\(.*?dim_labels=([^, ]+)", hlo)
  if jax.default_backend() != "cpu":
    pytest.skip("layout check is for XLA:CPU")
  assert labels, "no convolution found in the compiled loop"
  assert set(labels) == {"b01f_01io->b01f"}, labels


@pytest.mark.parametrize("xs,ws,pad", [((2, 9, 9, 1), (3, 3, 1, 4), "SAME"),
                                       ((2, 10, 7, 3), (3, 2, 3, 5), [(1, 2), (0, 1)]),
                                       ((3, 11, 2), (5, 2, 4), "VALID")])
def test_im2col_forward_equals_lax(monkeypatch, xs, ws, pad):
  """The first-layer path (a matmul over patches, taken on CPU when Eigen runs the
  convolutions): same values and gradients as lax, on 1-D and 2-D inputs."""
  from fedjax_inv.models import conv
  monkeypatch.setattr(conv, "eigen_convolutions", lambda: True)
  k1, k2, k3 = jax.random.split(jax.random.key(sum(xs)), 3)
  x, w = jax.random.normal(k1, xs), jax.random.normal(k2, ws)
  dn = NHWC if len(xs) == 4 else ("NWC", "WIO", "NWC")
  y_new, vjp_new = jax.vjp(lambda x, w: conv_general_dilated(
      x, w, (1,) * (len(xs) - 2), pad, dimension_numbers=dn), x, w)
  y_ref, vjp_ref = jax.vjp(lambda x, w: lax.conv_general_dilated(
      x, w, (1,) * (len(xs) - 2), pad, dimension_numbers=dn), x, w)
  np.testing.assert_allclose(y_new, y_ref, rtol=1e-5, atol=1e-5)
  ct = jax.random.normal(k3, y_ref.shape)
  for a, b in zip(vjp_new(ct), vjp_ref(ct)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
  if jax.default_backend() == "cpu":  # the path really ran: a dot, not a convolution
    hlo = jax.jit(lambda x, w: conv_general_dilated(
        x, w, (1,) * (len(xs) - 2), pad, dimension_numbers=dn)).lower(x, w).as_text()
    assert "convolution" not in hlo and "dot" in hlo, hlo[:2000]


@pytest.mark.parametrize("flags,want", [
    ("", False), ("--xla_cpu_experimental_ynn_fusion_type=", True),
    ("--xla_cpu_experimental_ynn_fusion_type=-individual_convolution", True),
    ("--xla_cpu_experimental_ynn_fusion_type=individual_dot,dot", True),
    ("--xla_cpu_experimental_ynn_fusion_type=individual_convolution", False),
    ("--xla_cpu_experimental_ynn_fusion_type=-dot", False),
    ("--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_experimental_ynn_fusion_type=+dot",
     False)])
def test_eigen_convolutions_reads_the_ynn_flag(flags, want):
  from fedjax_inv.models.conv import eigen_convolutions
  assert eigen_convolutions(flags) is want


# --------------------------------------------------------------- the 'patches' form
PATCH_CASES = CASES + [((2, 9, 9, 3), (1, 1, 3, 4), (2, 2), "VALID", None, NHWC),
                       ((2, 8, 8, 2), (3, 3, 2, 3), (1, 1), [(-1, 2), (1, 0)], None, NHWC)]


@pytest.mark.parametrize("xs,ws,strides,pad,rhs_dil,dn", PATCH_CASES)
def test_the_patches_form_equals_lax(xs, ws, strides, pad, rhs_dil, dn):
  """Under ``conv_form('patches')`` the convolution is strided slices and one matmul
  (no convolution in its program), with lax's values and gradients: strides, kernel
  dilation, 1x1 kernels, negative padding, 1-D inputs, NCHW layouts."""
  from fedjax_inv.core import strategy
  k1, k2, k3 = jax.random.split(jax.random.key(len(xs) + sum(ws) + 7), 3)
  x, w = jax.random.normal(k1, xs), jax.random.normal(k2, ws)

  def new(x, w):
    with strategy.conv_form("patches"):
      return conv_general_dilated(x, w, strides, pad, rhs_dilation=rhs_dil,
                                  dimension_numbers=dn)

  y_new, vjp_new = jax.vjp(new, x, w)
  y_ref, vjp_ref = jax.vjp(lambda x, w: lax.conv_general_dilated(
      x, w, strides, pad, rhs_dilation=rhs_dil, dimension_numbers=dn), x, w)
  np.testing.assert_allclose(y_new, y_ref, rtol=1e-5, atol=1e-5)
  ct = jax.random.normal(k3, y_ref.shape)
  for a, b in zip(vjp_new(ct), vjp_ref(ct)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
  prims = {e.primitive.name for e in jax.make_jaxpr(new)(x, w).jaxpr.eqns}
  assert "conv_general_dilated" not in prims and "dot_general" in prims, prims


def _cnns():
  from fedjax_inv.models import federated, resnet
  return {"cnn": (models.cnn(1, channels=(4, 8), num_outputs=3), (10, 10, 1)),
          "convnet": (models.convnet(1, image_size=(12, 12), channels=(4, 6), z_dim=8),
                      (12, 12, 1)),
          "femnist_cnn": (federated.femnist_cnn(num_classes=5, dropout=False),
                          (28, 28, 1)),
          "resnet18": (resnet.resnet(18, 4, base_width=4, groups=2, small_input=True,
                                     feature_dim=8), (8, 8, 3))}


@pytest.mark.parametrize("name", ["cnn", "convnet", "femnist_cnn",
                                  pytest.param("resnet18", marks=pytest.mark.slow)])
def test_every_cnn_vmapped_over_clients_is_the_same_in_both_forms(name):
  """Every CNN of ``models`` with per-client weights on a client axis (the engine's
  vmap): logits and parameter gradients of the patches form equal the convolution's to
  float32 tolerance, and its program has no convolution left."""
  from fedjax_inv.core import strategy
  model, shape = _cnns()[name]
  clients = 3
  params = jax.vmap(model.init)(jax.random.split(jax.random.key(1), clients))
  x = jax.random.uniform(jax.random.key(2), (clients, 2) + shape)

  def grads(p, x):
    return jax.value_and_grad(lambda p: jnp.sum(jnp.tanh(model.apply(p, x))))(p)

  def both(form):
    def f(p, x):
      with strategy.conv_form(form):
        return jax.vmap(grads)(p, x), jax.vmap(model.apply)(p, x)
    prims = set()
    todo = [jax.make_jaxpr(f)(params, x).jaxpr]
    while todo:
      for eqn in todo.pop().eqns:
        prims.add(eqn.primitive.name)
        for v in eqn.params.values():  # nested bodies (pjit, custom_vjp, scan)
          for item in v if isinstance(v, (tuple, list)) else (v,):
            inner = getattr(item, "jaxpr", item)
            if hasattr(inner, "eqns"):
              todo.append(inner)
    return jax.jit(f)(params, x), prims

  (want, prims_lax), (got, prims_patches) = both("lax"), both("patches")
  assert "conv_general_dilated" in prims_lax
  assert "conv_general_dilated" not in prims_patches
  chex.assert_trees_all_close(got, want, rtol=2e-4, atol=2e-5)
