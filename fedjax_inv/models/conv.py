"""A convolution whose gradients XLA:CPU runs fast inside loops.

``conv_general_dilated`` here computes exactly ``jax.lax.conv_general_dilated`` (same
forward op), but its VJP writes the input- and weight-gradient convolutions with
physically transposed operands in the canonical layout (batch, spatial..., feature) ×
(spatial..., in, out), instead of relying on JAX's transpose rules, which express them by
permuting ``dimension_numbers``.

Why: XLA:CPU canonicalizes such permuted convolutions into its fast (Eigen / YNNPACK)
kernels only outside ``while`` loops. Inside the engine's loops (``lax.scan`` over clients
or local steps) the weight-gradient convolution of a 3×3 layer on ``[32, 28, 28, 32]``
inputs stayed in layout ``f01b_i01o->01bf`` and ran ~50× slower (measured on the 2-core
CI machine, JAX 0.10.2: 8 SGD steps 13.6 s in a ``fori_loop`` vs 0.26 s unrolled; with this
VJP 0.27 s in both; ``benchmarks/RESULTS.md``). On GPU/TPU the two forms cost the same.

On CPU, when XLA runs convolutions on Eigen (``fedjax_inv.core.xla_cpu`` turns YNNPACK's
convolutions off on CPUs without AVX-512), a forward convolution with few input channels
and stride 1 (an image model's first layer) runs as im2col + one matmul instead
(``IM2COL_MAX_IN``); its result equals the convolution's up to float32 summation order.

Every CNN in ``fedjax_inv.models`` passes this function to ``nnx.Conv``.
"""
from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax

from fedjax_inv.core import strategy


def _dilate(shape, dilation):
  return tuple(0 if s == 0 else 1 + d * (s - 1) for s, d in zip(shape, dilation))


# When XLA:CPU runs convolutions on Eigen (YNNPACK's convolutions off, as
# ``fedjax_inv.core.xla_cpu`` sets on CPUs without AVX-512), a forward convolution with at most
# this many input channels runs as one matmul over its patches ("im2col"): the first layer
# of an image model (1 or 3 channels) gives Eigen's kernel too little work per output.
# Measured (2-core AMD EPYC, JAX 0.10.2, [32, 28, 28, 1] * [3, 3, 1, 32]): 1.02 ms on
# Eigen, 0.58 ms as a matmul, 0.39 ms on YNNPACK; the ConvNet round 1.05x faster (Eigen
# convolutions) and 0.93x (YNN convolutions); benchmarks/RESULTS.md. Other backends keep
# the convolution. 0 turns it off.
IM2COL_MAX_IN = 4


def eigen_convolutions(xla_flags: str | None = None) -> bool:
  """Whether ``XLA_FLAGS`` (default: the environment's) turns YNNPACK's standalone
  convolutions off (``--xla_cpu_experimental_ynn_fusion_type`` without
  ``individual_convolution``, or with ``-individual_convolution``)."""
  from fedjax_inv.core.xla_cpu import flag_value
  value = flag_value("xla_cpu_experimental_ynn_fusion_type", xla_flags)
  if value is None:
    return False
  items = [i for i in value.split(",") if i]
  if any(i[:1] in "+-" for i in items):
    return "-individual_convolution" in items
  return "individual_convolution" not in items


def _patches(x, k_sp: tuple, strides: tuple, pads: tuple, rhs_dil: tuple):
  """The patches of canonical ``x [N, S..., I]`` under a kernel of spatial shape ``k_sp``:
  ``[N, S'..., prod(k_sp)·I]``, kernel offsets major and input channels minor (the order
  of ``w.reshape(prod(k_sp)·I, O)`` for ``w [K..., I, O]``), made of strided slices of the
  padded input (negative padding crops)."""
  nd = x.ndim - 2
  xp = lax.pad(x, jnp.zeros((), x.dtype),
               ((0, 0, 0),) + tuple((lo, hi, 0) for lo, hi in pads) + ((0, 0, 0),))
  k_d = _dilate(k_sp, rhs_dil)
  out_sp = tuple((xp.shape[1 + d] - k_d[d]) // strides[d] + 1 for d in range(nd))
  cols = []
  for off in itertools.product(*(range(k) for k in k_sp)):
    start = tuple(o * r for o, r in zip(off, rhs_dil))
    if all(s == 1 for s in strides):
      cols.append(xp[(slice(None),) + tuple(slice(b, b + n) for b, n in zip(start, out_sp))])
    else:
      cols.append(lax.slice(xp, (0,) + start + (0,),
                            (xp.shape[0],) + tuple(b + (n - 1) * t + 1 for b, n, t in
                                                   zip(start, out_sp, strides))
                            + (xp.shape[-1],), (1,) + tuple(strides) + (1,)))
  return jnp.stack(cols, axis=-2).reshape(x.shape[:1] + out_sp + (-1,))


def _im2col(x, w, pads):
  """Stride-1, undilated convolution of canonical ``x [N, S..., I]`` with ``w [K..., I,
  O]`` as ``patches [N, S'..., prod(K)·I] @ w.reshape(prod(K)·I, O)`` (same result as the
  convolution up to float32 summation order)."""
  nd = x.ndim - 2
  k_sp = w.shape[:nd]
  patches = _patches(x, k_sp, (1,) * nd, pads, (1,) * nd)
  return jnp.dot(patches, w.reshape(math.prod(k_sp) * x.shape[-1], w.shape[-1]),
                 precision=lax.Precision.HIGHEST)


def patches_conv(x, w, strides: tuple, pads: tuple, rhs_dil: tuple, precision=None):
  """A convolution in the 'patches' form (``core.strategy.CONV_FORMS``): canonical
  ``x [N, S..., I]`` with ``w [K..., I, O]`` as ``patches [N, S'..., prod(K)·I] @
  w.reshape(prod(K)·I, O) -> [N, S'..., O]``, differentiated by JAX's own rules (slices
  and one matrix product), so that vmapped over a client axis with per-client weights the
  forward and both gradients are batched matrix products ``[C, ...] @ [C, ...]`` rather
  than one grouped convolution with a group per client.

  Equal to ``lax.conv_general_dilated`` with the same strides, padding and kernel
  dilation up to float32 summation order; ``precision`` as that function's (None: the
  default matmul precision in force, ``jax.default_matmul_precision``). Costs
  ``prod(K)`` times the input's memory for the patches.

  Raises:
    TypeError / ValueError: what ``jnp.dot`` raises for mismatched channels.

  Source: im2col (Chellapilla, Puri & Simard 2006, "High Performance Convolutional
  Neural Networks for Document Processing"); nothing paper-specific.
  """
  nd = x.ndim - 2
  k_sp = w.shape[:nd]
  cols = _patches(x, k_sp, strides, pads, rhs_dil)
  return jnp.dot(cols, w.reshape(math.prod(k_sp) * x.shape[-1], w.shape[-1]),
                 precision=precision)


def _canonical_dn(nd: int) -> lax.ConvDimensionNumbers:
  """(batch, spatial..., feature) × (spatial..., in, out) → (batch, spatial..., feature)."""
  sp = tuple(range(1, nd + 1))
  return lax.ConvDimensionNumbers(lhs_spec=(0, nd + 1) + sp,
                                  rhs_spec=(nd + 1, nd) + tuple(range(nd)),
                                  out_spec=(0, nd + 1) + sp)


@functools.lru_cache(maxsize=None)
def _canonical_conv(nd: int, strides: tuple, pads: tuple, rhs_dil: tuple, precision):
  """Custom-VJP convolution on canonical operands ``x [N, S..., I]``, ``w [K..., I, O]``
  (no input dilation, no feature groups)."""
  dn = _canonical_dn(nd)
  ones = (1,) * nd

  def direct(x, w):
    return lax.conv_general_dilated(x, w, strides, pads, ones, rhs_dil, dn,
                                    precision=precision)

  def fwd_conv(x, w):
    if (x.shape[-1] <= IM2COL_MAX_IN and all(s == 1 for s in strides)
        and all(d == 1 for d in rhs_dil) and eigen_convolutions()):
      return lax.platform_dependent(x, w, cpu=lambda x, w: _im2col(x, w, pads),
                                    default=direct)
    return direct(x, w)

  @jax.custom_vjp
  def conv(x, w):
    return fwd_conv(x, w)

  def conv_fwd(x, w):
    return fwd_conv(x, w), (x, w)

  def conv_bwd(res, dy):
    x, w = res
    in_sp, k_sp, out_sp = x.shape[1:-1], w.shape[:nd], dy.shape[1:-1]
    in_d, k_d, out_d = _dilate(in_sp, ones), _dilate(k_sp, rhs_dil), _dilate(out_sp, strides)
    lo = tuple(p[0] for p in pads)
    # dx: correlate the stride-dilated dy with the flipped kernel, I and O swapped.
    before = tuple(k - l - 1 for k, l in zip(k_d, lo))
    after = tuple(i + k - 1 - o - b for i, k, o, b in zip(in_d, k_d, out_d, before))
    w_t = jnp.swapaxes(lax.rev(w, tuple(range(nd))), nd, nd + 1)   # [K..., O, I]
    dx = lax.conv_general_dilated(dy, w_t, ones, tuple(zip(before, after)), strides,
                                  rhs_dil, dn, precision=precision)
    # dw: the input channels act as the batch, the examples as the contracted feature.
    hi = tuple((o - i) + (k - l - 1) for o, i, k, l in zip(out_d, in_d, k_d, lo))
    perm_x = (nd + 1,) + tuple(range(1, nd + 1)) + (0,)        # [I, S..., N]
    perm_dy = tuple(range(1, nd + 1)) + (0, nd + 1)            # [S'..., N, O]
    dw = lax.conv_general_dilated(jnp.transpose(x, perm_x), jnp.transpose(dy, perm_dy),
                                  rhs_dil, tuple(zip(lo, hi)), ones, strides, dn,
                                  precision=precision)          # [I, K..., O]
    dw = jnp.transpose(dw, tuple(range(1, nd + 1)) + (0, nd + 1))
    return dx.astype(x.dtype), dw.astype(w.dtype)

  conv.defvjp(conv_fwd, conv_bwd)
  return conv


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                         batch_group_count=1, precision=None, preferred_element_type=None,
                         **kwargs):
  """Drop-in for ``jax.lax.conv_general_dilated`` (``nnx.Conv(conv_general_dilated=...)``).

  Same arguments, shapes and forward result as the ``lax`` function (``lhs`` ``[N, ...]``
  in the layout of ``dimension_numbers``; the client axis, if any, is added by ``vmap``
  outside). For the common case — no input dilation, ``feature_group_count ==
  batch_group_count == 1``, no ``preferred_element_type`` or sharding arguments — the
  operands are transposed to the canonical layout and the convolution gets the custom VJP
  described in the module docstring (identity transposes for NHWC/HWIO inputs; on CPU a
  first layer's forward may be im2col + matmul, equal up to float32 summation order);
  anything else is passed to ``lax.conv_general_dilated`` unchanged.

  Raises:
    TypeError: whatever ``lax.conv_general_dilated`` raises for the same arguments
      (``TypeError`` / ``ValueError`` on mismatched shapes or dimension numbers).

  Source: the transpose rules of a convolution (gradient w.r.t. input = correlation with
  the flipped kernel; w.r.t. kernel = correlation of input with output gradient), as in
  ``jax.lax``'s own VJP; nothing paper-specific.
  """
  nd = lhs.ndim - 2
  extra = {k: v for k, v in kwargs.items() if v is not None}
  lhs_d = tuple(lhs_dilation or (1,) * nd)
  if (feature_group_count != 1 or batch_group_count != 1 or preferred_element_type is not None
      or extra or any(d != 1 for d in lhs_d) or nd < 1):
    return lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
        feature_group_count, batch_group_count, precision, preferred_element_type, **kwargs)
  dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  strides = tuple(int(s) for s in window_strides)
  rhs_d = tuple(int(d) for d in (rhs_dilation or (1,) * nd))
  if isinstance(padding, str):
    in_sp = [lhs.shape[d] for d in dn.lhs_spec[2:]]
    k_sp = _dilate([rhs.shape[d] for d in dn.rhs_spec[2:]], rhs_d)
    pads = tuple(lax.padtype_to_pads(in_sp, k_sp, strides, padding))
  else:
    pads = tuple((int(lo), int(hi)) for lo, hi in padding)
  x = jnp.transpose(lhs, (dn.lhs_spec[0],) + tuple(dn.lhs_spec[2:]) + (dn.lhs_spec[1],))
  w = jnp.transpose(rhs, tuple(dn.rhs_spec[2:]) + (dn.rhs_spec[1], dn.rhs_spec[0]))
  pads = tuple(tuple(p) for p in pads)
  if strategy.current_conv_form() == "patches":
    y = patches_conv(x, w, strides, pads, rhs_d, precision)
  else:
    y = _canonical_conv(nd, strides, pads, rhs_d, precision)(x, w)
  perm = [0] * (nd + 2)
  perm[dn.out_spec[0]] = 0
  perm[dn.out_spec[1]] = nd + 1
  for i, d in enumerate(dn.out_spec[2:]):
    perm[d] = 1 + i
  return jnp.transpose(y, perm)
