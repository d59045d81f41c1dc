"""Surviving mutants that no test can kill, with the reason (read by run.py).

Keyed by module name, then by the mutant's diff lines (``-original``, ``+mutated``) so
that an entry follows its line when the file moves. An entry is a claim: each reason says
why every input gives the same values and gradients.
"""
_PREGATHER = ("the pre-gather threshold only chooses between gathering all K minibatches "
              "before the scan and gathering one per step; both paths give the same numbers "
              "(tests/test_engine_reference.py::test_scan_unroll_and_pregather_paths_agree), "
              "so a different threshold changes memory and speed, not results.")

_AXIS = ('multiclass logits are [n, K] here (checked by _classification_inputs before any computation), so axis +1 is axis -1.')

_DIV_KEEP = ('keep is 1.0 on a present row (x / 1 = x * 1) and 0.0 on a masked one, whose entries were zeroed first, so the numerator is 0; XLA:CPU evaluates that converted-bool 0 / 0 as 0 (checked), the same as 0 * 0. Only a backend that produced NaN there could tell.')

EQUIVALENT: dict[str, dict[tuple, str]] = {
    "aggregators": {
        ("-  safe_e = jnp.where(e > 0, e, jnp.ones_like(e))",
         "+  safe_e = jnp.where(e > 1, e, jnp.ones_like(e))"):
        "e = |E| is a client count (0, 1, 2, ...): the two conditions differ only at e = 1, "
        "where both give 1.",
        ("-  f32 = jnp.float32", "+  f32 = None"):
        "x.astype(None) casts to JAX's default float dtype, float32 (the package runs "
        "without jax_enable_x64), so every cast is unchanged.",
        ("-  log_a = jnp.log(jnp.where(a == 0, 1.0, jnp.abs(a)))",
         "+  log_a = jnp.log(jnp.where(a == 0, 2.0, jnp.abs(a)))"):
        "the placeholder only replaces log|0|; at a zero entry both sign masks pa and na are "
        "0 and multiply it away before any sum (value and gradient).",
        ("-  log_d = jnp.log(jnp.where(d == 0, 1.0, jnp.abs(d)))",
         "+  log_d = jnp.log(jnp.where(d == 0, 2.0, jnp.abs(d)))"):
        "as for log_a: at a zero entry of d both pd and nd are 0.",
        ("-  pa, na = (a > 0) * keep, (a < 0) * keep",
         "+  pa, na = (a > 0) / keep, (a < 0) * keep"): _DIV_KEEP,
        ("-  pa, na = (a > 0) * keep, (a < 0) * keep",
         "+  pa, na = (a > 0) * keep, (a < 0) / keep"): _DIV_KEEP,
        ("-  hi = jax.lax.Precision.HIGHEST", "+  hi = None"):
        "on the CPU backend (where this suite runs) an f32 matmul is computed at full f32 "
        "precision whatever the precision argument; HIGHEST matters on GPU/TPU (TF32/bf16 "
        "passes), which CI does not have.",
        ("-    safe = jnp.where(count > 0, count, jnp.ones_like(count))",
         "+    safe = jnp.where(count > 1, count, jnp.ones_like(count))"):
        "count is the number of present clients (0, 1, 2, ...): the conditions differ only "
        "at count = 1, where both give 1.",
        ("-  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)",
         "+  return optax.GradientTransformationExtraArgs(lambda params: None, update)"):
        "the stage is stateless: None and optax.EmptyState() are both leafless pytrees that "
        "update passes through unread.",
    },
    "local_train": {
        ('-    if strategy_lib.pregathered(K, B, x.dtype.itemsize * math.prod(x.shape[1:])):',
         '+    if strategy_lib.pregathered(K, B, x.dtype.itemsize / math.prod(x.shape[1:])):'):
        _PREGATHER,
        ('-    if strategy_lib.pregathered(K, B, x.dtype.itemsize * math.prod(x.shape[1:])):',
         '+    if strategy_lib.pregathered(K, B, x.dtype.itemsize * math.prod(x.shape[2:])):'):
        _PREGATHER,
        ('-      ones = jnp.ones((K, B), jnp.float32)',
         '+      ones = None'):
        "a minibatch with w=None is unweighted: core.losses.weighted_mean(v, None) = mean(v), the same value and gradient as weights of ones.",
    },
    "losses": {
        ("-    return (jnp.argmax(logits, -1) == labels.astype(jnp.int32)).astype(jnp.float32)",
         "+    return (jnp.argmax(logits, +1) == labels.astype(jnp.int32)).astype(jnp.float32)"):
        "multiclass logits are [n, K] (the documented shape; the engine vmaps over clients "
        "and eval passes one client's rows), so axis 1 is axis -1.",
    },
    "penalties": {
        ("-  lse = jax.nn.logsumexp(logits, axis=-1)",
         "+  lse = jax.nn.logsumexp(logits, axis=+1)"): _AXIS,
        ("-  picked = jnp.take_along_axis(logits, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]",
         "+  picked = jnp.take_along_axis(logits, labels[:, None].astype(jnp.int32), axis=+1)[:, 0]"): _AXIS,
        ("-  picked = jnp.take_along_axis(logits, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]",
         "+  picked = jnp.take_along_axis(logits, labels[:, None].astype(jnp.int32), axis=-1)[:, 1]"):
        "the gathered array is [n, 1]; JAX clamps the static out-of-range index 1 to 0, the "
        "same column (numpy would raise; jax.numpy does not).",
        ("-  k = logits.shape[-1]", "+  k = logits.shape[+1]"): _AXIS,
        ("-  return jax.nn.softmax(logits, axis=-1) - jax.nn.one_hot(labels, k, dtype=logits.dtype)",
         "+  return jax.nn.softmax(logits, axis=+1) - jax.nn.one_hot(labels, k, dtype=logits.dtype)"): _AXIS,
        ("-  per_sample = err.reshape(n, -1).mean(axis=1) if err.ndim > 1 else err",
         "+  per_sample = err.reshape(n, -1).mean(axis=1) if err.ndim >= 1 else err"):
        "for a 1-D err [n], err.reshape(n, -1).mean(axis=1) is err itself.",
        ("-  grad = jax.grad(lambda w: loss_fn(logits * w, labels, weights))(scale)",
         "+  grad = jax.grad(lambda w: loss_fn(logits / w, labels, weights))(scale)"):
        "at the dummy scale w = 1, d/dw l(f / w) = -d/dw l(f * w); IRMv1 is the squared norm "
        "of that derivative, so value and gradients are the same.",
        ("-def _mask_rows(x, keep, fill=0):", "+def _mask_rows(x, keep, fill=1):"):
        "every caller drops the masked rows again with a second where (the double-where "
        "pattern) or gives them weight 0, so the fill value never reaches a result or a "
        "gradient; 0 and 1 are both finite.",
        ("-  return jnp.where(wsum > 0, total / safe, jnp.zeros_like(wsum))",
         "+  return jnp.where(wsum >= 0, total / safe, jnp.zeros_like(wsum))"):
        "weights are >= 0, so wsum >= 0 always holds; when wsum == 0, safe is 1 and total "
        "is 0 (every row masked), so total / safe is exactly the 0 of the other branch, "
        "and its gradient w.r.t. values is masked to 0 by the inner where.",
    },
}
