"""Max pooling whose gradient is cheap on every backend.

``nnx.max_pool`` is ``lax.reduce_window(max)``; its VJP is ``select_and_scatter``, which
XLA:CPU runs slowly (one client's 5 SGD steps of ``models.cnn(1)`` took 110-119 ms
with it; pooling 2×2 by reshape + max took 83 ms, on the 2-core CI machine, JAX 0.10.2).
:func:`max_pool` computes the same forward values with plain reductions instead:

* non-overlapping windows (``strides == window``, no padding): crop to whole windows,
  ``reshape`` ``[B, H, W, C] → [B, H/k, k, W/k, k, C]`` and ``max`` over the window axes;
* any other window (e.g. ResNet's 3×3 stride 2, padding 1): pad with ``-inf``, take one
  strided slice per window offset and ``max`` over the stacked slices.

Forward values equal ``nnx.max_pool`` exactly (a max is exact). Gradients:

* non-overlapping windows: a custom VJP gives each window's whole cotangent to its first
  maximum in row-major window order, which is what ``select_and_scatter`` does, so the
  gradient equals ``nnx.max_pool``'s exactly, ties included. It is one fused elementwise
  pass (measured, ConvNet round on a 2-core AMD EPYC: 1.07x faster than JAX's rule for
  ``max``, which counts the ties and divides; ``benchmarks/RESULTS.md``). A window whose
  maximum is NaN passes no gradient.
* other windows: JAX's rule for ``max``: equal to ``nnx.max_pool`` wherever a window's
  maximum is unique; at ties the cotangent is split evenly among the tied positions (the
  sum over the window is the same). After a ReLU the common tie is a window of zeros, and
  ReLU's derivative at 0 is 0, so parameter gradients agree there too.
"""
from __future__ import annotations

import itertools
from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax


def _pairs(padding, x_shape, window, strides):
  spatial = x_shape[1:-1]
  if isinstance(padding, str):
    if padding.upper() not in ("VALID", "SAME"):
      raise ValueError(f"padding={padding!r}; use 'VALID', 'SAME' or a sequence of "
                       f"(low, high) pairs, one per spatial axis.")
    return tuple(lax.padtype_to_pads(spatial, window, strides, padding.upper()))
  pads = tuple(tuple(int(v) for v in p) for p in padding)
  if len(pads) != len(spatial) or any(len(p) != 2 or min(p) < 0 for p in pads):
    raise ValueError(f"padding={padding!r}: need {len(spatial)} non-negative (low, high) "
                     f"pairs, one per spatial axis of x {tuple(x_shape)}.")
  return pads


@jax.custom_vjp
def _window_max(xw: jax.Array) -> jax.Array:
  """``max`` of ``xw [B, o1, k1, o2, k2, ..., C]`` over its window axes ``k1, k2, ...``."""
  return jnp.max(xw, axis=tuple(range(2, xw.ndim - 1, 2)))


def _window_max_fwd(xw):
  y = _window_max(xw)
  return y, (xw, y)


def _window_max_bwd(res, g):
  """The whole cotangent of each window goes to its first maximum in row-major window
  order, as ``select_and_scatter`` (``nnx.max_pool``'s gradient) gives it: one fused
  elementwise pass, instead of JAX's rule for ``max`` (count the ties, divide)."""
  xw, y = res
  window = xw.shape[2:-1:2]
  taken = jnp.zeros(y.shape, bool)
  parts = {}
  for pos in itertools.product(*(range(k) for k in window)):  # row-major window order
    idx = [slice(None)] * xw.ndim
    for i, p in enumerate(pos):
      idx[2 + 2 * i] = p
    hit = (xw[tuple(idx)] == y) & ~taken
    taken = taken | hit
    parts[pos] = jnp.where(hit, g, jnp.zeros_like(g))

  def assemble(prefix):  # window axis i goes back right after output axis i
    i = len(prefix)
    if i == len(window):
      return parts[prefix]
    return jnp.stack([assemble(prefix + (p,)) for p in range(window[i])], axis=2 + i)
  return (assemble(()),)


_window_max.defvjp(_window_max_fwd, _window_max_bwd)


def max_pool(x: jax.Array, window_shape: Sequence[int], strides: Sequence[int] | None = None,
             padding="VALID") -> jax.Array:
  """Max pooling over the spatial axes of channels-last ``x``; same values as
  ``flax.nnx.max_pool`` (module docstring: gradients and ties).

  Args:
    x: ``[B, *spatial, C]`` (e.g. ``[B, H, W, C]``); under the engine's ``vmap`` ``B`` is
      one client's batch.
    window_shape: window size per spatial axis, e.g. ``(2, 2)``.
    strides: step per spatial axis (default 1 on every axis, as in ``nnx.max_pool``;
      pass ``window_shape`` for non-overlapping windows).
    padding: ``'VALID'`` (default), ``'SAME'`` or ``((low, high), ...)`` per spatial axis;
      padded positions hold ``-inf`` and never win.

  Returns:
    ``[B, *out_spatial, C]`` with ``out = (in + low + high - window) // stride + 1``.

  Raises:
    ValueError: ``x`` without a batch and a channel axis, window/strides of the wrong
      length or non-positive, a bad ``padding``, or a window larger than the padded input.

  Source: measured on XLA:CPU (a drop-in for ``nnx.max_pool`` in every model of
  ``fedjax_inv.models``).
  """
  nd = x.ndim - 2
  window = tuple(int(w) for w in window_shape)
  strides = (1,) * nd if strides is None else tuple(int(s) for s in strides)
  if nd < 1 or len(window) != nd or len(strides) != nd:
    raise ValueError(f"max_pool: x {tuple(x.shape)} needs [B, *spatial, C] with one window "
                     f"and stride per spatial axis, got window_shape={window}, "
                     f"strides={strides}.")
  if min(window) < 1 or min(strides) < 1:
    raise ValueError(f"max_pool: window_shape={window} and strides={strides} must be "
                     f"positive.")
  pads = _pairs(padding, x.shape, window, strides)
  padded = tuple(s + lo + hi for s, (lo, hi) in zip(x.shape[1:-1], pads))
  if any(p < w for p, w in zip(padded, window)):
    raise ValueError(f"max_pool: window {window} is larger than the padded input "
                     f"{padded} of x {tuple(x.shape)}.")
  out = tuple((p - w) // s + 1 for p, w, s in zip(padded, window, strides))
  if strides == window and not any(lo or hi for lo, hi in pads):
    # Non-overlapping: crop to whole windows, split each spatial axis into (out, window).
    x = x[(slice(None),) + tuple(slice(0, o * w) for o, w in zip(out, window))]
    split = (x.shape[0],)
    for o, w in zip(out, window):
      split += (o, w)
    x = x.reshape(split + (x.shape[-1],))
    return _window_max(x)
  if any(lo or hi for lo, hi in pads):
    x = jnp.pad(x, ((0, 0),) + pads + ((0, 0),), constant_values=-jnp.inf)
  slices = []
  for offset in itertools.product(*(range(w) for w in window)):
    idx = (slice(None),) + tuple(slice(d, d + s * (o - 1) + 1, s)
                                 for d, s, o in zip(offset, strides, out))
    slices.append(x[idx])
  return jnp.max(jnp.stack(slices, axis=0), axis=0)

