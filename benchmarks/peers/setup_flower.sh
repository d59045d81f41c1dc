#!/usr/bin/env bash
# Creates benchmarks/peers/.venv-flower with Flower (`flwr[simulation]`: the Ray backend of
# Flower's Simulation Engine) and CPU PyTorch, the peer that bench_flower.py runs. Its own
# environment: flwr pins protobuf/grpcio/cryptography ranges and `[simulation]` pulls Ray,
# which the other peers do not need. Never a dependency of fedjax_inv.
# Usage:  bash benchmarks/peers/setup_flower.sh             (idempotent; ~1-3 minutes)
#         FLOWER_VENV=/tmp/flwr FLWR_VERSION=1.42.0 bash benchmarks/peers/setup_flower.sh
#         TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" ...  (CPU wheel
#         where PyPI's default torch is the CUDA build and no local CPU wheel is found)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${FLOWER_VENV:-$HERE/.venv-flower}"
PY="${PYTHON:-python3}"
# The latest flwr that installs on Python 3.11 when this was written (issue: flwr 1.42).
FLWR_VERSION="${FLWR_VERSION:-1.42.0}"
# Same torch as the pfl / other peers' environments when one is there, else their pin.
TORCH_VERSION="${TORCH_VERSION:-}"
for other in "$HERE/.venv-pfl" "$HERE/.venv"; do
  if [ -z "$TORCH_VERSION" ] && [ -x "$other/bin/python" ]; then
    TORCH_VERSION="$("$other/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
  fi
done
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
echo "flower venv: $VENV  (flwr[simulation]==$FLWR_VERSION, torch==$TORCH_VERSION)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip || true
status=0
# torch first (so later installs find it satisfied and do not pull another build).
$PIP install -q "torch==$TORCH_VERSION" ${TORCH_PIP_ARGS:-} || { echo "SETUP-FAIL torch"; status=1; }
$PIP install -q "flwr[simulation]==$FLWR_VERSION" "torch==$TORCH_VERSION" ${TORCH_PIP_ARGS:-} \
  || { echo "SETUP-FAIL flwr[simulation]"; status=1; }
$VENV/bin/python - <<'PY'
import importlib
for name in ("flwr", "ray", "torch", "numpy"):
  try:
    m = importlib.import_module(name)
    print(f"  {name:8s} {getattr(m, '__version__', '?')}")
  except Exception as e:  # report, do not fail: bench_flower.py records errors itself
    print(f"  {name:8s} IMPORT-ERROR {type(e).__name__}: {e}")
try:
  import torch
  print(f"  torch cuda build: {torch.version.cuda}  threads: {torch.get_num_threads()}")
  from flwr.simulation import run_simulation  # noqa: F401
  from flwr.simulation.ray_transport.ray_actor import ClientAppActor  # noqa: F401
  print("  flwr.simulation.run_simulation + Ray backend import ok")
except Exception as e:
  print(f"  flwr simulation (Ray backend) IMPORT-ERROR {type(e).__name__}: {e}")
PY
exit $status
