#!/usr/bin/env bash
# Creates benchmarks/peers/.venv-pfl with Apple's pfl-research (`pfl`, PyTorch backend, CPU),
# the peer that bench_pfl.py runs. Its own environment: pfl pins numpy/packaging/wheel ranges
# and pulls dp-accounting, prv-accountant, multiprocess, which the other peers do not need.
# Never a dependency of fedjax_inv.
# Usage:  bash benchmarks/peers/setup_pfl.sh             (idempotent; ~1-3 minutes)
#         PFL_VENV=/tmp/pfl PFL_VERSION=0.6.0 bash benchmarks/peers/setup_pfl.sh
#         TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" ...  (CPU wheel
#         where PyPI's default torch is the CUDA build and no local CPU wheel is found)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${PFL_VENV:-$HERE/.venv-pfl}"
PY="${PYTHON:-python3}"
PFL_VERSION="${PFL_VERSION:-0.6.0}"
# Same torch as the other peers' environment (setup.sh) when it is there, else setup.sh's pin.
TORCH_VERSION="${TORCH_VERSION:-}"
if [ -z "$TORCH_VERSION" ] && [ -x "$HERE/.venv/bin/python" ]; then
  TORCH_VERSION="$("$HERE/.venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
fi
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
echo "pfl venv: $VENV  (pfl==$PFL_VERSION, torch==$TORCH_VERSION)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip || true
status=0
# torch first (so pfl[pytorch] finds it satisfied and does not pull another build).
$PIP install -q "torch==$TORCH_VERSION" ${TORCH_PIP_ARGS:-} || { echo "SETUP-FAIL torch"; status=1; }
$PIP install -q "pfl[pytorch]==$PFL_VERSION" "torch==$TORCH_VERSION" ${TORCH_PIP_ARGS:-} \
  || { echo "SETUP-FAIL pfl"; status=1; }
$VENV/bin/python - <<'PY'
import importlib
for name in ("pfl", "torch", "numpy"):
  try:
    m = importlib.import_module(name)
    print(f"  {name:8s} {getattr(m, '__version__', '?')}")
  except Exception as e:  # report, do not fail: bench_pfl.py records errors itself
    print(f"  {name:8s} IMPORT-ERROR {type(e).__name__}: {e}")
try:
  import torch
  print(f"  torch cuda build: {torch.version.cuda}  threads: {torch.get_num_threads()}")
  from pfl.model.pytorch import PyTorchModel  # noqa: F401
  print("  pfl.model.pytorch.PyTorchModel import ok")
except Exception as e:
  print(f"  pfl pytorch backend IMPORT-ERROR {type(e).__name__}: {e}")
PY
exit $status
