"""Strict pytree helpers for the tests.

Zipping the two leaf lists (``jax.tree.leaves``) stops at the shorter one, so a tree with
missing leaves (or an empty one) passes a leaf-by-leaf check. Compare trees with
``chex.assert_trees_all_close`` / ``chex.assert_trees_all_equal`` (they check the tree
structure first, and numpy checks each leaf's shape); for a *distance* between two trees
(e.g. "training moved the params") use :func:`max_abs_diff`, which checks structure and
shapes before it measures anything.
"""
import chex
import jax
import numpy as np


def max_abs_diff(a, b) -> float:
  """``max |a - b|`` over all leaves of two trees of the same structure and leaf shapes.

  Raises AssertionError if the structures or any leaf shapes differ, or if the trees have
  no leaves (a distance over nothing would make any "moved" / "differs" check vacuous).
  """
  chex.assert_trees_all_equal_shapes(a, b)
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert la, "max_abs_diff of two trees without leaves"
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             if np.size(x) else 0.0 for x, y in zip(la, lb, strict=True))
