"""Slow, obviously-correct reference implementations: a plain Python loop over clients.

Shares only the documented randomness with the engine (which clients are sampled and which
minibatch indices each local step draws) so results can be compared to float32 tolerance.
Optimizers, aggregation and the losses are written out by hand from the papers' formulas:
nothing here uses ``fedjax_inv``'s math (only its models, through ``model.apply``), so a
bug in ``fedjax_inv.core.losses`` cannot cancel out of an engine-vs-reference comparison.
"""
import jax
import jax.numpy as jnp
import numpy as np


# ---------------------------------------------------------------------------------------
# Losses, in plain jax.numpy
# ---------------------------------------------------------------------------------------


def log_sigmoid(z):
  """``log σ(z) = -log(1 + e^{-z}) = min(z, 0) - log(1 + e^{-|z|})``: the exponent is
  never positive, so neither form overflows for large ``|z|``."""
  return jnp.minimum(z, 0.0) - jnp.log1p(jnp.exp(-jnp.abs(z)))


def per_example_loss(kind, logits, labels):
  """``[n]`` losses: binary = sigmoid cross-entropy ``-[y log σ(z) + (1-y) log σ(-z)]``;
  multiclass = softmax cross-entropy ``logsumexp(z) - z_y``; regression = ``(z - y)²``."""
  if kind == "binary":
    z = logits.reshape(labels.shape)
    y = labels.astype(z.dtype)
    return -(y * log_sigmoid(z) + (1.0 - y) * log_sigmoid(-z))
  if kind == "multiclass":
    # logsumexp written out: shift by the row max (the value does not depend on it).
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    lse = m[:, 0] + jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1))
    onehot = labels.astype(jnp.int32)[:, None] == jnp.arange(logits.shape[-1])
    return lse - jnp.sum(jnp.where(onehot, logits, 0.0), axis=-1)
  if kind == "regression":
    z = logits.reshape(labels.shape)
    return jnp.square(z - labels.astype(z.dtype))
  raise ValueError(f"unknown loss kind {kind!r}")


def mean_loss(kind, logits, labels, w=None):
  """``Σ w ℓ / Σ w`` (plain mean without weights); rows with ``w = 0`` (padding) are
  dropped with ``where``, so their loss never enters the sum."""
  ell = per_example_loss(kind, logits, labels)
  if w is None:
    return jnp.mean(ell)
  w = jnp.asarray(w, ell.dtype)
  ell = jnp.where(w > 0, ell, 0.0)
  return jnp.sum(w * ell) / jnp.sum(w)


def pooled_eval(logits_fn, kind, data):
  """``{'loss', 'accuracy'}`` pooled over every client's real rows of ``data``:
  ``Σ ℓ / Σ n`` and ``Σ correct / Σ n`` (accuracy only for classification), counted here
  in numpy. ``logits_fn(x)`` gets one client's full padded block ``[n_max, ...]`` with the
  padded rows zeroed (the evaluator's input) and returns its ``[n_max, ...]`` logits."""
  x, y, n = np.asarray(data.x), np.asarray(data.y), np.asarray(data.n)
  loss_sum, correct = 0.0, 0
  for i in range(x.shape[0]):
    real = np.arange(x.shape[1]) < n[i]
    xi = np.where(real.reshape((-1,) + (1,) * (x.ndim - 2)), x[i], 0).astype(x.dtype)
    logits = np.asarray(logits_fn(jnp.asarray(xi)))[: n[i]]
    yi = y[i, : n[i]]
    loss_sum += float(np.sum(np.asarray(per_example_loss(kind, jnp.asarray(logits),
                                                         jnp.asarray(yi)), np.float64)))
    if kind == "multiclass":
      correct += int(np.sum(logits.argmax(-1) == yi))
    elif kind == "binary":
      correct += int(np.sum((logits.reshape(yi.shape) > 0).astype(yi.dtype) == yi))
  out = {"loss": loss_sum / int(n.sum())}
  if kind != "regression":
    out["accuracy"] = correct / int(n.sum())
  return out


# ---------------------------------------------------------------------------------------
# The engine's documented randomness, and the FedAvg-family loop
# ---------------------------------------------------------------------------------------


def round_keys(key, rnd, num_clients, cohort):
  k_sample, k_clients = jax.random.split(jax.random.fold_in(key, rnd))
  idx = np.asarray(jax.random.choice(k_sample, num_clients, (cohort,), replace=False))
  return idx, [jax.random.fold_in(k_clients, int(i)) for i in idx]


def batch_indices(client_key, local_steps, n, batch_size):
  """The engine's documented minibatch draw: client key -> (train key, message key);
  train key -> (batch key, loss key); batch key -> randint [K, B] over [0, n)."""
  k_train, _ = jax.random.split(client_key)
  kb, _ = jax.random.split(k_train)
  if batch_size is None:
    return [None] * local_steps
  return list(np.asarray(jax.random.randint(kb, (local_steps, batch_size), 0, n)))


def epoch_batches(client_key, epochs, n, n_max, batch_size):
  """The engine's documented epoch draw (``Algorithm.local_epochs``): batch key -> one key
  per epoch -> ``uniform [n_max]``; the epoch's order sorts the real rows ``[0, n)`` by
  that draw; consecutive slices of ``batch_size`` (the last one shorter) are the steps.
  Returns the list of index arrays (real rows only: padding never enters a batch here)."""
  k_train, _ = jax.random.split(client_key)
  kb, _ = jax.random.split(k_train)
  out = []
  for ke in jax.random.split(kb, epochs):
    u = np.asarray(jax.random.uniform(ke, (n_max,)))[:n]
    order = sorted(range(n), key=lambda j: u[j])
    out += [np.array(order[s:s + batch_size]) for s in range(0, n, batch_size)]
  return out


def loss_fn(model, kind, params, x, y, w):
  return mean_loss(kind, model.apply(params, x), y, w)


def tmap(f, *trees):
  return jax.tree.map(f, *trees)


def reference_run(model, kind, data, params, *, rounds, cohort, key, local_steps,
                  batch_size, client_lr, client_momentum=None, server="sgd",
                  server_lr=1.0, server_momentum=0.9, b1=0.9, b2=0.99, tau=1e-3,
                  weighting="num_examples", mu=0.0, scaffold=False, local_epochs=None,
                  clients=None, labels=None, steps=None, updates=None, aggregate=None,
                  ditto=None, per_example_clip=None):
  """Runs ``rounds`` rounds with a Python loop over clients and returns the params.

  ``per_example_clip``: None, or ``C``: DP-SGD without noise (Abadi et al. 2016): each
  step's gradient is ``Σ_i g_i min(1, C/‖g_i‖) / batch_size`` over the step's rows, every
  per-example gradient ``g_i`` taken on its own.

  ``ditto``: None, or ``{'lam', 'steps', 'lr'}``: every sampled client also takes
  ``steps`` personal SGD steps ``v ← v − lr (∇F(v) + lam (v − w_t))`` (Ditto eq. 2, Alg. 1)
  from its own ``v`` (the initial params before its first round) on minibatches drawn
  with the client's message key (client key -> (train key, message key); message key ->
  (index key, _); index key -> randint [steps, B] over [0, n)); the personal models are
  left in ``ditto['v']`` (a list over the pool).

  Hooks (issue 26; each gets plain numpy / Python values): ``clients(rnd, idx, ckeys)
  -> kept slot positions`` (dropout, availability); ``labels(i, y) -> y`` (label
  flipping of pool client ``i``); ``steps(ck, K) -> steps run`` (stragglers);
  ``updates(rnd, idx, deltas) -> deltas`` (attacks on the updates); ``aggregate(deltas,
  weights) -> pseudo-gradient`` (robust aggregators; default the weighted mean)."""
  N = data.num_clients
  x_all, y_all, n_all = (np.asarray(data.x), np.asarray(data.y), np.asarray(data.n))
  m_state = tmap(jnp.zeros_like, params)
  v_state = tmap(lambda p: jnp.full_like(p, tau ** 2), params)
  c_server = tmap(jnp.zeros_like, params)
  c_clients = [tmap(jnp.zeros_like, params) for _ in range(N)]
  grad = jax.jit(jax.grad(lambda p, x, y, w: loss_fn(model, kind, p, x, y, w)))
  if ditto is not None:
    ditto["v"] = [params] * N
  for rnd in range(rounds):
    idx, ckeys = round_keys(key, rnd, N, cohort)
    if clients is not None:
      keep = clients(rnd, idx, ckeys)
      idx, ckeys = [idx[j] for j in keep], [ckeys[j] for j in keep]
    deltas, weights, dcs = [], [], []
    for i, ck in zip(idx, ckeys):
      n = int(n_all[i])
      xi, yi = x_all[i], y_all[i]
      if labels is not None:
        yi = labels(int(i), yi)
      p = params
      mom = tmap(jnp.zeros_like, params)
      if local_epochs is None:
        batches = batch_indices(ck, local_steps, n, batch_size)
      else:
        batches = epoch_batches(ck, local_epochs, n, len(xi), batch_size)
      if steps is not None:
        batches = batches[:steps(ck, len(batches))]
      for bidx in batches:
        if bidx is None:
          xb, yb, wb = xi, yi, (np.arange(len(xi)) < n).astype(np.float32)
        else:
          xb, yb, wb = xi[bidx], yi[bidx], np.ones(len(bidx), np.float32)
        if per_example_clip is None:
          g = grad(p, xb, yb, wb)
        else:
          g = _clipped_sum(grad, p, xb, yb, wb, per_example_clip, batch_size)
        if mu:
          g = tmap(lambda g, w, w0: g + mu * (w - w0), g, p, params)
        if scaffold:
          g = tmap(lambda g, c, ci: g - ci + c, g, c_server, c_clients[i])
        if client_momentum:
          mom = tmap(lambda m, g: client_momentum * m + g, mom, g)
          g = mom
        p = tmap(lambda w, g: w - client_lr * g, p, g)
      if ditto is not None:
        ditto["v"][i] = _ditto_personal(grad, ditto, ditto["v"][i], params, ck, xi, yi, n,
                                        batch_size)
      deltas.append(tmap(jnp.subtract, params, p))
      weights.append(float(n) if weighting == "num_examples" else 1.0)
      if scaffold:
        k_i = len(batches)
        ci_new = tmap(lambda ci, c, x0, y: ci - c + (x0 - y) / (k_i * client_lr),
                      c_clients[i], c_server, params, p)
        dcs.append(tmap(jnp.subtract, ci_new, c_clients[i]))
        c_clients[i] = ci_new
    if updates is not None:
      deltas = updates(rnd, list(idx), deltas)
    wsum = sum(weights)
    if aggregate is not None:
      pg = aggregate(deltas, weights)
    else:
      pg = tmap(lambda *ds: sum(w * d for w, d in zip(weights, ds)) / wsum, *deltas)
    if scaffold:
      mean_dc = tmap(lambda *ds: sum(ds) / len(ds), *dcs)
      c_server = tmap(lambda c, d: c + (cohort / N) * d, c_server, mean_dc)
    if server == "sgd":
      params = tmap(lambda w, g: w - server_lr * g, params, pg)
    elif server == "momentum":
      m_state = tmap(lambda m, g: server_momentum * m + g, m_state, pg)
      params = tmap(lambda w, m: w - server_lr * m, params, m_state)
    else:
      d = tmap(jnp.negative, pg)
      m_state = tmap(lambda m, d: b1 * m + (1 - b1) * d, m_state, d)
      if server == "adagrad":
        v_state = tmap(lambda v, d: v + d * d, v_state, d)
      elif server == "adam":
        v_state = tmap(lambda v, d: b2 * v + (1 - b2) * d * d, v_state, d)
      else:
        v_state = tmap(lambda v, d: v - (1 - b2) * d * d * np.sign(v - d * d), v_state, d)
      params = tmap(lambda w, m, v: w + server_lr * m / (jnp.sqrt(v) + tau), params,
                    m_state, v_state)
  return params


def _ditto_personal(grad, ditto, v, w_t, ck, xi, yi, n, batch_size):
  """One client's Ditto personal steps (see ``reference_run``'s ``ditto``)."""
  _, k_msg = jax.random.split(ck)
  k_idx, _ = jax.random.split(k_msg)
  if batch_size is None:
    batches = [None] * ditto["steps"]
  else:
    batches = list(np.asarray(jax.random.randint(k_idx, (ditto["steps"], batch_size), 0,
                                                 n)))
  for bidx in batches:
    if bidx is None:
      xb, yb, wb = xi, yi, (np.arange(len(xi)) < n).astype(np.float32)
    else:
      xb, yb, wb = xi[bidx], yi[bidx], np.ones(len(bidx), np.float32)
    g = grad(v, xb, yb, wb)
    v = tmap(lambda a, b, c: a - ditto["lr"] * (b + ditto["lam"] * (a - c)), v, g, w_t)
  return v


def _clipped_sum(grad, p, xb, yb, wb, clip, batch_size):
  """``Σ_i g_i min(1, C/‖g_i‖) / B``, one example at a time (rows of weight 0 skipped)."""
  total = tmap(jnp.zeros_like, p)
  for j in range(len(yb)):
    if wb[j] == 0:
      continue
    g = grad(p, xb[j:j + 1], yb[j:j + 1], np.ones(1, np.float32))
    norm = float(np.sqrt(sum(float(np.sum(np.square(np.asarray(leaf))))
                             for leaf in jax.tree.leaves(g))))
    f = min(1.0, clip / norm) if norm > 0 else 1.0
    total = tmap(lambda t, gi: t + f * gi, total, g)
  return tmap(lambda t: t / batch_size, total)
