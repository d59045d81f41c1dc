"""The "before" side of the pooling A/B: ``fedjax-inv bench`` with the models' max
pooling swapped back to ``flax.nnx.max_pool`` (``lax.reduce_window``, whose gradient is
``select_and_scatter``), everything else unchanged. Run it beside a plain ``bench`` with
the same flags, in one process after the other on one machine, and compare the rows.
  python benchmarks/pool_ab.py --workloads cnn --clients 10,100 --json before.json
"""
import sys

from flax import nnx

import fedjax_inv.models as models
import fedjax_inv.models.resnet as resnet
from fedjax_inv import cli


def main(argv=None) -> int:
  """Patches ``max_pool`` in the model modules to ``nnx.max_pool`` and runs
  ``fedjax-inv bench`` with ``argv`` (default ``sys.argv[1:]``); returns its exit code."""
  models.max_pool = nnx.max_pool
  resnet.max_pool = nnx.max_pool
  return cli.main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
  sys.exit(main())
