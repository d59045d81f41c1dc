"""fedjax_inv.core.xla_cpu: the package's XLA:CPU flags merge into XLA_FLAGS, never override
it, have a switch, and do not change results beyond float32 rounding (issue 30)."""
import json
import os
import subprocess
import sys

import pytest

from fedjax_inv.core import xla_cpu

FLAGS = {"xla_cpu_a": "1", "xla_cpu_b": ""}


@pytest.fixture(autouse=True)
def _started(monkeypatch):
  # JAX's backends are running in this test process: pretend they are not, per test.
  monkeypatch.setattr(xla_cpu, "backends_started", lambda: False)
  monkeypatch.setattr(xla_cpu, "_STATUS", dict(xla_cpu._STATUS))  # restored after


def test_merges_into_an_empty_or_set_xla_flags():
  env = {}
  assert xla_cpu.apply(env, FLAGS) == FLAGS
  assert env["XLA_FLAGS"] == "--xla_cpu_a=1 --xla_cpu_b="
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  xla_cpu.apply(env, FLAGS)
  assert env["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=8 "
                              "--xla_cpu_a=1 --xla_cpu_b=")
  assert xla_cpu.status()["added"] == FLAGS


def test_the_users_value_wins():
  env = {"XLA_FLAGS": "--xla_cpu_a=7"}
  assert xla_cpu.apply(env, FLAGS) == {"xla_cpu_b": ""}
  assert env["XLA_FLAGS"] == "--xla_cpu_a=7 --xla_cpu_b="
  assert "xla_cpu_a" in xla_cpu.status()["note"]


@pytest.mark.parametrize("off", ["0", "false", "OFF", "no"])
def test_switch_turns_it_off(off):
  env = {xla_cpu.SWITCH: off, "XLA_FLAGS": "--x=1"}
  assert xla_cpu.apply(env, FLAGS) == {}
  assert env["XLA_FLAGS"] == "--x=1"
  assert xla_cpu.status()["note"].startswith("off")


def test_nothing_added_once_backends_started(monkeypatch):
  monkeypatch.setattr(xla_cpu, "backends_started", lambda: True)
  env = {}
  assert xla_cpu.apply(env, FLAGS) == {}
  assert "XLA_FLAGS" not in env
  assert "backends had started" in xla_cpu.status()["note"]


def test_unparsable_xla_flags_is_named():
  with pytest.raises(ValueError, match="XLA_FLAGS='--a=\"b' cannot be parsed"):
    xla_cpu.apply({"XLA_FLAGS": '--a="b'}, FLAGS)


def test_flags_only_on_measured_hosts(monkeypatch):
  """FLAGS were measured on x86-64 without AVX-512 with jaxlib 0.10: other hosts get none
  (an XLA flag that a newer jaxlib does not know would abort the process)."""
  import platform
  monkeypatch.setattr(platform, "machine", lambda: "x86_64")
  monkeypatch.setattr(xla_cpu, "_jaxlib_version", lambda: "0.10.2")
  monkeypatch.setattr(xla_cpu, "_cpu_has_avx512", lambda: False)
  assert xla_cpu.host_wants_flags() == (True, "")
  env = {}
  assert xla_cpu.apply(env) == xla_cpu.FLAGS
  assert env["XLA_FLAGS"] == " ".join(f"--{k}={v}" for k, v in xla_cpu.FLAGS.items())
  for attr, value, why in [("_cpu_has_avx512", lambda: True, "AVX-512"),
                           ("_cpu_has_avx512", lambda: None, "unknown"),
                           ("_jaxlib_version", lambda: "0.11.0", "jaxlib 0.11.0")]:
    with monkeypatch.context() as m:
      m.setattr(xla_cpu, attr, value)
      wanted, reason = xla_cpu.host_wants_flags()
      assert not wanted and why in reason
      env = {"XLA_FLAGS": "--x=1"}
      assert xla_cpu.apply(env) == {}
      assert env == {"XLA_FLAGS": "--x=1"} and why in xla_cpu.status()["note"]
  monkeypatch.setattr(platform, "machine", lambda: "aarch64")
  assert xla_cpu.host_wants_flags()[0] is False


def test_avx512_read_from_cpuinfo(tmp_path):
  f = tmp_path / "cpuinfo"
  f.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 fma\n")
  assert xla_cpu._cpu_has_avx512(str(f)) is False
  f.write_text("flags\t\t: fpu avx2 avx512f avx512bw\n")
  assert xla_cpu._cpu_has_avx512(str(f)) is True
  assert xla_cpu._cpu_has_avx512(str(tmp_path / "missing")) is None


_CHILD = r"""
import json, jax, jax.numpy as jnp, numpy as np, fedjax_inv
from fedjax_inv import models
from fedjax_inv.core import xla_cpu
rng = np.random.default_rng(0)
m = models.cnn(1, channels=(8, 16))
p = m.init(jax.random.key(0))
x = jnp.asarray(rng.random((32, 28, 28, 1), dtype=np.float32))
y = jnp.asarray(rng.integers(0, 10, 32))
def loss(p):
  import optax
  return optax.softmax_cross_entropy_with_integer_labels(m.apply(p, x), y).mean()
@jax.jit
def train(p):
  def step(p, _):
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p)), None
  return jax.lax.scan(step, p, None, length=5)[0]
out = train(p)
print(json.dumps(dict(xla_flags=xla_cpu.status()["xla_flags"], loss=float(loss(out)),
                      leaves=[np.asarray(l).ravel().tolist() for l in jax.tree.leaves(out)])))
"""


# The flags timed in benchmarks/RESULTS.md ("XLA:CPU flags"): the package's own (if any) and
# YNN fusions off, the measured candidate that a user may enable through XLA_FLAGS.
CANDIDATES = [" ".join(f"--{k}={v}" for k, v in xla_cpu.FLAGS.items())] * bool(xla_cpu.FLAGS) \
    + ["--xla_cpu_experimental_ynn_fusion_type="]


@pytest.mark.multiprocess
@pytest.mark.parametrize("flags", CANDIDATES)
def test_results_with_and_without_the_flags_agree(flags):
  """A ConvNet's 5 SGD steps give the same parameters (float32 rounding) with the flags as
  without them: each run in its own process, the package's flags off in both."""
  import numpy as np
  runs = {}
  for setting in (flags, ""):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update({xla_cpu.SWITCH: "0", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": setting})
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         text=True, timeout=600, check=True).stdout
    runs[setting] = json.loads(out.strip().splitlines()[-1])
  a, b = runs[flags], runs[""]
  assert a["xla_flags"] == flags and b["xla_flags"] == ""  # the settings really applied
  assert len(a["leaves"]) == len(b["leaves"]) > 0
  for x, y in zip(a["leaves"], b["leaves"], strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)  # 5 SGD steps in float32
  np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4)


def test_flag_value_reads_the_last_occurrence():
  flags = "--xla_a=1 --xla_force_host_platform_device_count=8 --xla_a='x y'"
  assert xla_cpu.flag_value("xla_a", flags) == "x y"
  assert xla_cpu.flag_value("xla_b", flags) is None
  with pytest.raises(ValueError):
    xla_cpu.flag_value("xla_a", '--xla_a="b')
