#!/usr/bin/env bash
# Creates benchmarks/peers/.venv with the peer FL simulators the harness compares against:
#   FedJAX 0.0.17 (jit backend `for_each_client`), DrJAX (`map_fn`), PyTorch (CPU).
# They are never dependencies of fedjax_inv; this environment is separate on purpose.
# Usage:  bash benchmarks/peers/setup.sh            (idempotent; ~2-5 minutes)
#         PEERS_VENV=/tmp/peers bash benchmarks/peers/setup.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${PEERS_VENV:-$HERE/.venv}"
PY="${PYTHON:-python3}"
JAX_VERSION="${JAX_VERSION:-}"
# Same JAX as the package's own venv when it is there (a fair comparison).
if [ -z "$JAX_VERSION" ] && [ -x "$HERE/../../.venv/bin/python" ]; then
  JAX_VERSION="$("$HERE/../../.venv/bin/python" -c 'import jax; print(jax.__version__)')"
fi
JAX_PIN="jax${JAX_VERSION:+==$JAX_VERSION}"
echo "peers venv: $VENV  ($JAX_PIN)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip wheel setuptools || true
status=0
# JAX + FedJAX. FedJAX 0.0.17 (2023) pins nothing tightly; its pmap backend needs the removed
# jax.device_put_replicated, its jit backend works.
$PIP install -q "$JAX_PIN" "fedjax==0.0.17" || { echo "SETUP-FAIL fedjax"; status=1; }
# DrJAX: map_fn / reduce_mean over a placed client axis.
$PIP install -q "$JAX_PIN" drjax || { echo "SETUP-FAIL drjax"; status=1; }
# PyTorch CPU. Where PyPI's default torch wheel is the CUDA build, add
#   --index-url https://download.pytorch.org/whl/cpu   (TORCH_PIP_ARGS) for the CPU one.
$PIP install -q "torch==2.13.0" ${TORCH_PIP_ARGS:-} || { echo "SETUP-FAIL torch"; status=1; }
$VENV/bin/python - <<'PY'
import importlib
for name in ("jax", "fedjax", "drjax", "torch", "haiku", "optax"):
  try:
    m = importlib.import_module(name)
    print(f"  {name:8s} {getattr(m, '__version__', '?')}")
  except Exception as e:  # report, do not fail: bench_peers.py records per-peer errors
    print(f"  {name:8s} IMPORT-ERROR {type(e).__name__}: {e}")
PY
exit $status
