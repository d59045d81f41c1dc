"""Surviving mutants that no test can kill, with the reason (read by run.py).

Keyed by module name, then by the mutant's diff lines (``-original``, ``+mutated``) so
that an entry follows its line when the file moves. An entry is a claim: each reason says
why every input gives the same values and gradients.
"""
_PREGATHER = ("the pre-gather threshold only chooses between gathering all K minibatches "
              "before the scan and gathering one per step; both paths give the same numbers "
              "(tests/test_engine_reference.py::test_scan_unroll_and_pregather_paths_agree), "
              "so a different threshold changes memory and speed, not results.")

_AXIS = ("multiclass logits are [n, K] here (checked by _classification_inputs before any computation), so axis +1 is axis -1.")

_DIV_KEEP = ("keep is 1.0 on a present row (x / 1 = x * 1) and 0.0 on a masked one, whose entries were zeroed first, so the numerator is 0; XLA:CPU evaluates that converted-bool 0 / 0 as 0 (checked), the same as 0 * 0. Only a backend that produced NaN there could tell.")

_Q_ONE = ("both change q only where it is >= 1 (2 instead of 1 for the whole client; "
          "min(2, B/n) instead of 1 for a batch at least the client's size), and every "
          "q >= 1 takes the same branch, one = gaussian: the same event.")

_POISSON_ONE = ("q <= 1 always (min(1.0, ...) or 1.0), so the conditions differ only at "
                "q = 1, where dp-accounting's RDP of PoissonSampledDpEvent(1.0, G) is "
                "alpha / (2 sigma^2), the Gaussian's own (compute_one_order's q == 1 case): "
                "the same epsilon.")

_NEEDS_KEY = ("needs_key is read only as a truth value (core/engine.py's finalize_with_key "
              "and round function, bucketing's kw) and decides only whether finalize gets "
              "key=; the rules of median, trimmed mean, Krum, the geometric median and "
              "centered clipping never read the key, so passing it (True) or not (None) "
              "gives the same aggregate.")

_NOVA_EMPTY = ("safe differs only at wsum = 0 (weights are >= 0: every client absent), and "
               "there the result is jnp.where(wsum > 0, ..., 0.0) = 0 whatever safe and "
               "tau_eff = tw / safe hold (0 / 0 = NaN in the branch not taken included).")

EQUIVALENT: dict[str, dict[tuple, str]] = {
    "privacy": {
        ("-    if hi > SIGMA_MAX:", "+    if hi >= SIGMA_MAX:"):
        "hi starts at 1.0 and only doubles, so it is a power of two and never equals "
        "SIGMA_MAX = 1000; > and >= give the same answer for every hi it takes.",
        ("-    if mid > 0 and eps(mid) <= target_epsilon:",
         "+    if mid >= 0 and eps(mid) <= target_epsilon:"):
        "mid = (lo + hi) / 2 with lo >= 0 and hi > 0 (hi starts at 1.0 or above and is "
        "only ever set to an earlier mid > 0), so mid > 0 always: the conditions agree.",
    },
    "dp_sgd": {
        ("-      return objective(params, Batch(x=x[None], y=y[None], w=jnp.ones((1,), jnp.float32)),",
         "+      return objective(params, Batch(x=x[None], y=y[None], w=jnp.ones((2,), jnp.float32)),"):
        "apply admits only task-only objectives, core.losses.mean_loss = Σ w ℓ / Σ w; the "
        "weights [1, 1] broadcast the one example's row into two equal rows, whose mean is "
        "that example's loss (the same value and gradient).",
        ("-  q = 1.0 if batch_size is None else min(1.0, batch_size / max(n, 1))",
         "+  q = 2.0 if batch_size is None else min(1.0, batch_size / max(n, 1))"): _Q_ONE,
        ("-  q = 1.0 if batch_size is None else min(1.0, batch_size / max(n, 1))",
         "+  q = 1.0 if batch_size is None else min(2.0, batch_size / max(n, 1))"): _Q_ONE,
        ("-  one = gaussian if q >= 1.0 else dpa.PoissonSampledDpEvent(q, gaussian)",
         "+  one = gaussian if q > 1.0 else dpa.PoissonSampledDpEvent(q, gaussian)"): _POISSON_ONE,
        ("-  one = gaussian if q >= 1.0 else dpa.PoissonSampledDpEvent(q, gaussian)",
         "+  one = gaussian if q >= 2.0 else dpa.PoissonSampledDpEvent(q, gaussian)"): _POISSON_ONE,
        ('-  acc = _accountant("rdp", "poisson")  # RDP, add-or-remove-one',
         '+  acc = _accountant("XXrdpXX", "poisson")  # RDP, add-or-remove-one'):
        "privacy._accountant returns the PLD accountant for 'pld' only and the RDP one for "
        "any other name, 'XXrdpXX' included.",
        ("-  worst, at = -1.0, None", "+  worst, at = -2.0, None"):
        "an epsilon is >= 0 (or inf), so the first client size beats either start.",
    },
    "adversary": {
        ("-  u = jnp.where(online, jax.random.uniform(k_pick, (num_clients,)), 2.0)",
         "+  u = jnp.where(online, jax.random.uniform(k_pick, (num_clients,)), 3.0)"):
        "an online client's key is uniform in [0, 1): an offline one's 2.0 or 3.0 sorts after "
        "every online one (argsort is stable) and fails the u < 2.0 test either way.",
    },
    "robust": {
        ("-def _gathered(rule, name: str, needs_key: bool = False) -> Aggregator:",
         "+def _gathered(rule, name: str, needs_key: bool = True) -> Aggregator:"): _NEEDS_KEY,
        ("-  finalize.needs_key = needs_key", "+  finalize.needs_key = None"): _NEEDS_KEY,
        ("-    take = jnp.minimum(m, jnp.maximum(k, 1))",
         "+    take = jnp.minimum(m, jnp.maximum(k, 2))"):
        "the two differ only for k <= 1 present clients and m >= 2. With k = 1 the present "
        "client's score is 0 and every absent one's is inf, so the second pick is an absent "
        "client, dropped by sel & present; with k = 0 finalize returns zeros (anyone).",
        ("-    x = jnp.where(present[:, None], x, 0.0)  # an absent client's update may hold inf/NaN",
         "+    x = jnp.where(present[:, None], x, 1.0)  # an absent client's update may hold inf/NaN"):
        "any finite fill works: an absent row has a = 0, so it adds 0 to a @ x, and b = a / d "
        "= 0 (d >= nu > 0) to b @ x and sum(b), in every step.",
        ("-    order = jnp.argsort(jnp.where(present, u, 2.0))  # present clients first, shuffled",
         "+    order = jnp.argsort(jnp.where(present, u, 3.0))  # present clients first, shuffled"):
        "u is uniform in [0, 1): any key above 1 sorts the absent clients after every present "
        "one, in index order (argsort is stable), so the order is the same.",
        ("-      return jnp.sum(jnp.where(m > 0, g, 0.0) * m, axis=1) / jnp.maximum(",
         "+      return jnp.sum(jnp.where(m > 0, g, 1.0) * m, axis=1) / jnp.maximum("):
        "m is 0.0 or 1.0 (a present flag): where m = 0 the product is 0 * 0 or 1 * 0 = 0, "
        "and where m = 1 both keep g.",
        ("-    safe = jnp.where(wsum > 0, wsum, 1.0)", "+    safe = jnp.where(wsum >= 0, wsum, 1.0)"):
        _NOVA_EMPTY,
        ("-    safe = jnp.where(wsum > 0, wsum, 1.0)", "+    safe = jnp.where(wsum > 0, wsum, 2.0)"):
        _NOVA_EMPTY,
        ("-    return jax.tree.map(lambda v: jnp.where(wsum > 0, v / safe * tau_eff, 0.0), d)",
         "+    return jax.tree.map(lambda v: jnp.where(wsum >= 0, v / safe * tau_eff, 0.0), d)"):
        "the conditions differ only at wsum = 0, where every client is absent (weights are "
        ">= 0), so d = 0 and tw = 0: the mutant returns 0 / 1 * 0 = 0, as the original does.",
    },
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
        ("-    if strategy_lib.pregathered(K, B, x.dtype.itemsize * math.prod(x.shape[1:])):",
         "+    if strategy_lib.pregathered(K, B, x.dtype.itemsize / math.prod(x.shape[1:])):"):
        _PREGATHER,
        ("-    if strategy_lib.pregathered(K, B, x.dtype.itemsize * math.prod(x.shape[1:])):",
         "+    if strategy_lib.pregathered(K, B, x.dtype.itemsize * math.prod(x.shape[2:])):"):
        _PREGATHER,
        ("-      ones = jnp.ones((K, B), jnp.float32)",
         "+      ones = None"):
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
