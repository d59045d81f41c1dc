"""Where a ConvNet SGD step's time goes on CPU, measured inside the step.

Times one client's local update of ``models.cnn(1)``'s layers (conv 1→32, 32→64, 64→64,
3×3 SAME, ReLU, 2×2 max-pools, global max, dense 64→10; batch 32, 5 SGD steps, 4 clients
in a ``lax.scan``, like the engine's ``scan``) for variants of the convolution's backward
pass, alternating the variants in one process (A, B, A, B, ...; medians):

* ``package``: ``fedjax_inv.models.conv.conv_general_dilated`` (what every model uses);
* ``no_dw2`` / ``no_dx2`` / ``no_dw3`` / ``no_dx3`` / ``no_dw1``: that gradient replaced by
  zeros, so the time it saves is its cost *inside* the step (serial micro-benchmarks of one
  convolution mislead: XLA:CPU runs independent convolutions, e.g. a layer's dx and dw,
  concurrently);
* ``im2col_dw``: every weight gradient as one matmul over the patches;
* ``winograd``: forward and input gradient of the 32→64 and 64→64 layers by Winograd
  F(2×2, 3×3) (2.25× fewer multiplies; the transforms are elementwise, the products 16
  batched matmuls).

Also prints this machine's matmul rate (2048² float32) and the step's rate (FLOPs of the
convolutions and the dense layer, forward + backward, counted analytically).

Usage: ``python benchmarks/conv_ablation.py --json benchmarks/results_conv_ablation.json``
(``taskset -c 0 python ...`` for one core).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

G = [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]


def _winograd(x, w):
  """SAME 3×3 stride-1 convolution of ``x [N, H, W, C]`` with ``w [3, 3, C, O]`` by
  Winograd F(2×2, 3×3) (Lavin & Gray 2016): input tiles 4×4 at stride 2."""
  import jax.numpy as jnp
  from jax import lax
  n, h, wd, c = x.shape
  o = w.shape[-1]
  th, tw = (h + 1) // 2, (wd + 1) // 2
  xp = jnp.pad(x, ((0, 0), (1, 1 + 2 * th - h), (1, 1 + 2 * tw - wd), (0, 0)))

  def bt(d0, d1, d2, d3):
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3
  v = []
  for r in bt(*[xp[:, i:i + 2 * th:2] for i in range(4)]):
    v.extend(bt(*[r[:, :, j:j + 2 * tw:2] for j in range(4)]))
  v = jnp.stack(v).reshape(16, n * th * tw, c)
  g = jnp.asarray(G, x.dtype)
  u = jnp.einsum("ai,ijco,bj->abco", g, w, g, precision="highest").reshape(16, c, o)
  m = lax.dot_general(v, u, (((2,), (1,)), ((0,), (0,))), precision="highest")
  m = m.reshape(4, 4, n, th, tw, o)
  r0, r1 = m[0] + m[1] + m[2], m[1] - m[2] - m[3]
  y = jnp.stack([jnp.stack([r[0] + r[1] + r[2], r[1] - r[2] - r[3]], 3)
                 for r in (r0, r1)], 2)
  return y.reshape(n, 2 * th, 2 * tw, o)[:, :h, :wd]


def _conv(dw_mode: str = "conv", dx_mode: str = "conv", fwd_mode: str = "conv"):
  """A 3×3 SAME convolution with a custom VJP whose pieces follow the modes."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from fedjax_inv.models.conv import _im2col
  dn = ("NHWC", "HWIO", "NHWC")

  def direct(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)

  def fwd(x, w, mode):
    if x.shape[-1] <= 4:  # the first layer: im2col, as the package does on CPU
      return _im2col(x, w, ((1, 1), (1, 1)))
    return _winograd(x, w) if mode == "winograd" else direct(x, w)

  def patches(x):
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    h, wd = x.shape[1:3]
    return jnp.stack([xp[:, a:a + h, b:b + wd] for a in range(3) for b in range(3)], -2)

  @jax.custom_vjp
  def conv(x, w):
    return fwd(x, w, fwd_mode)

  def conv_fwd(x, w):
    return fwd(x, w, fwd_mode), (x, w)

  def conv_bwd(res, dy):
    x, w = res
    i, o = w.shape[2:]
    w_t = jnp.swapaxes(lax.rev(w, (0, 1)), 2, 3)
    dx = _winograd(dy, w_t) if dx_mode == "winograd" and i > 4 else direct(dy, w_t)
    if dw_mode == "im2col":
      dw = jnp.dot(patches(x).reshape(-1, 9 * i).T, dy.reshape(-1, o),
                   precision="highest").reshape(3, 3, i, o)
    else:
      dw = jnp.transpose(lax.conv_general_dilated(
          jnp.transpose(x, (3, 1, 2, 0)), jnp.transpose(dy, (1, 2, 0, 3)), (1, 1),
          ((1, 1), (1, 1)), dimension_numbers=dn), (1, 2, 0, 3))
    if dw_mode == "zero":
      dw = jnp.zeros_like(w)
    if dx_mode == "zero":
      dx = jnp.zeros_like(x)
    return dx, dw

  conv.defvjp(conv_fwd, conv_bwd)
  return conv


def _variants():
  from fedjax_inv.models.conv import conv_general_dilated
  pkg = lambda x, w: conv_general_dilated(x, w, (1, 1), "SAME",  # noqa: E731
                                          dimension_numbers=("NHWC", "HWIO", "NHWC"))
  c = _conv()
  return {
      "package": [pkg] * 3,
      "no_dw1": [_conv(dw_mode="zero"), c, c],
      "no_dw2": [c, _conv(dw_mode="zero"), c],
      "no_dx2": [c, _conv(dx_mode="zero"), c],
      "no_dw3": [c, c, _conv(dw_mode="zero")],
      "no_dx3": [c, c, _conv(dx_mode="zero")],
      "im2col_dw": [_conv(dw_mode="im2col")] * 3,
      "winograd": [c] + [_conv(dx_mode="winograd", fwd_mode="winograd")] * 2,
  }


def _step_flops(b: int = 32) -> float:
  """Forward + backward FLOPs of one step (the first layer has no input gradient)."""
  layers = [(28, 1, 32, False), (14, 32, 64, True), (7, 64, 64, True)]
  f = sum(2 * b * h * h * 9 * i * o * (3 if dx else 2) for h, i, o, dx in layers)
  return f + 2 * b * 64 * 10 * 3


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import fedjax_inv  # noqa: F401  (sets the package's XLA:CPU flags before JAX starts)
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax import lax
  from fedjax_inv.models.pool import max_pool

  k = jax.random.split(jax.random.key(0), 8)
  he = lambda key, s: jax.random.normal(key, s) * np.sqrt(2.0 / np.prod(s[:-1]))  # noqa: E731
  params = {"convs": [(he(k[0], (3, 3, 1, 32)), jnp.zeros(32)),
                      (he(k[1], (3, 3, 32, 64)), jnp.zeros(64)),
                      (he(k[2], (3, 3, 64, 64)), jnp.zeros(64))],
            "dense": (he(k[3], (64, 10)), jnp.zeros(10))}
  x = jax.random.uniform(k[4], (64, 28, 28, 1))
  y = jax.random.randint(k[5], (64,), 0, 10)
  idx = jax.random.randint(k[6], (5, 32), 0, 64)
  opt = optax.sgd(0.1)
  clients = jax.tree.map(lambda v: jnp.stack([v] * 4), params)

  def build(convs):
    def apply(p, xb):
      h = xb
      for i, (w, b) in enumerate(p["convs"]):
        h = jax.nn.relu(convs[i](h, w) + b)
        if i < 2:
          h = max_pool(h, (2, 2), strides=(2, 2))
      return jnp.max(h, (1, 2)) @ p["dense"][0] + p["dense"][1]

    def step(carry, i):
      q, s = carry
      g = jax.grad(lambda q: optax.softmax_cross_entropy_with_integer_labels(
          apply(q, x[i]), y[i]).mean())(q)
      u, s = opt.update(g, s, q)
      return (optax.apply_updates(q, u), s), None

    def run(ps):
      return lax.scan(lambda _, q: (None, lax.scan(step, (q, opt.init(q)), idx)[0][0]),
                      None, ps)[1]
    return jax.jit(run)

  fns = {name: build(convs) for name, convs in _variants().items()}
  outs = {name: jax.block_until_ready(f(clients)) for name, f in fns.items()}
  times = {name: [] for name in fns}
  for _ in range(a.repeats):
    for name, f in fns.items():
      t = time.perf_counter()
      jax.block_until_ready(f(clients))
      times[name].append(time.perf_counter() - t)
  base = statistics.median(times["package"])
  sq = jnp.ones((2048, 2048))
  mm = jax.jit(lambda m: m @ m)
  mm(sq).block_until_ready()
  t = time.perf_counter()
  for _ in range(5):
    mm(sq).block_until_ready()
  peak = 2 * 2048 ** 3 / ((time.perf_counter() - t) / 5) / 1e9
  rows = {}
  for name, v in times.items():
    med = statistics.median(v)
    diff = max(float(jnp.abs(u - w).max()) for u, w in
               zip(jax.tree.leaves(outs[name]), jax.tree.leaves(outs["package"])))
    rows[name] = dict(ms_per_step=1e3 * med / 20, speedup_vs_package=base / med,
                      max_abs_param_diff=diff)
    print(f"{name:10s} {1e3 * med / 20:6.2f} ms/step  {base / med:5.2f}x  "
          f"max |param diff| {diff:.1e}", flush=True)
  rate = _step_flops() / (base / 20) / 1e9
  print(f"step: {_step_flops() / 1e9:.3f} GFLOP at {rate:.0f} GFLOP/s; matmul 2048² "
        f"{peak:.0f} GFLOP/s ({100 * rate / peak:.0f} %)")
  if a.json:
    from fedjax_inv.runner import outputs
    outputs.write_json(a.json, dict(
        jax=jax.__version__, xla_flags=os.environ.get("XLA_FLAGS", ""),
        cpus=len(os.sched_getaffinity(0)), variants=rows, step_gflop=_step_flops() / 1e9,
        step_gflops_per_s=rate, matmul_2048_gflops_per_s=peak))
  return 0


if __name__ == "__main__":
  sys.exit(main())
