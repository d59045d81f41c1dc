"""The task record and its registry: a task = federated training clients + evaluation sets +
model + loss kind. Task families register themselves in ``fedjax_inv/tasks/<family>.py``;
``fedjax_inv/tasks/__init__.py`` imports them all (the one place).

``make_task(name, data_dir=None, source='auto', download=False, seed=0, **kw) -> Task``.
No task downloads anything unless ``download=True``; offline, image tasks fall back to the
real digits that ship inside packages and say so in ``task.info``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from fedjax_inv import models
from fedjax_inv.core import losses
from fedjax_inv.core.algorithm import registry as algorithm_registry
from fedjax_inv.core.data import ClientData
from fedjax_inv.core.packed import PackedPool

POOL_TYPES = (ClientData, PackedPool)


@dataclasses.dataclass
class Task:
  """A federated learning task.

  Attributes:
    name: registry name.
    kind: 'binary' | 'multiclass' | 'regression'.
    train: the client pool (``N`` training clients): a resident ``ClientData``, or a
      packed host pool (``core.packed.PackedPool``) that a run keeps on the host or
      pads onto the device (``simulation.resolve_pool``).
    eval_sets: ``{name: ClientData or PackedPool}`` evaluation sets, e.g. ``{'ood': ...}``;
      the training
      clients are always evaluated too (as ``train``).
    model: ``FunctionalModel`` the papers use for this task; for a custom NNX module
      ``models.FunctionalModel.from_factory(lambda rngs: Net(..., rngs=rngs))`` (any
      module with a ``__call__``; Fishr, FedSR and FedIIR also need its
      ``.featurizer`` / ``.classifier`` split).
    info: provenance (paper, data source, split sizes) for ``summary.json``.
    defaults: default run settings (rounds, eval_every, clients_per_round, and client
      hyperparameters) for this task; the optional key ``per_algorithm`` maps an
      algorithm name to settings that apply to that algorithm only (its tuned
      hyperparameters on this task).
    train_eval: None (``train_*`` metrics over every training client), or a tuple of
      training-client indices evaluated as ``train`` instead (pools of thousands of
      clients, whose full evaluation would cost more than the training it reports).
  """
  name: str
  kind: str
  train: ClientData
  eval_sets: dict
  model: models.FunctionalModel
  info: dict
  defaults: dict = dataclasses.field(default_factory=dict)
  train_eval: tuple | None = None

  def __post_init__(self):
    check_task(self)
    if self.train_eval is not None:
      idx = [int(i) for i in self.train_eval]
      if not idx or min(idx) < 0 or max(idx) >= self.train.num_clients:
        raise ValueError(f"Task {self.name!r}: train_eval indices must be in "
                         f"0..{self.train.num_clients - 1} (got {len(idx)} indices).")

  def train_for_eval(self) -> ClientData:
    """The training clients evaluated as ``train_*``: all, or those in ``train_eval``."""
    if self.train_eval is None:
      return self.train
    cached = self.__dict__.get("_train_eval_data")
    if cached is None:
      import numpy as np
      cached = self.train.take(np.asarray(self.train_eval, np.int32))
      self.__dict__["_train_eval_data"] = cached
    return cached


  def algorithm_settings(self, name: str, overrides: dict | None = None) -> dict:
    """Hyperparameters for algorithm ``name`` on this task: the task's client defaults
    (minus the knobs the algorithm fixes itself, e.g. FedSGD's), then
    ``defaults['per_algorithm'][name]``, then ``overrides`` (the user's flags/config).
    The fixed knobs are the registry's (``core.algorithm.registry``, filled by
    ``fedjax_inv.algorithms``, which the package's ``__init__`` imports)."""
    entry = algorithm_registry().get(name)
    fixed = entry.fixed if entry is not None else ()
    kw = {k: v for k, v in self.defaults.items()
          if k not in ("rounds", "eval_every", "clients_per_round", "per_algorithm")
          and k not in fixed}
    kw.update(self.defaults.get("per_algorithm", {}).get(name, {}))
    kw.update(overrides or {})
    return kw


KINDS = losses.KINDS  # defined once, beside the losses that read it


def _output_dim(model, feature_shape) -> int:
  """Number of model outputs ``K`` for inputs ``[1, *feature_shape]`` (no FLOPs run)."""
  import jax
  import jax.numpy as jnp
  params = jax.eval_shape(lambda: model.init(0))
  spec = jax.ShapeDtypeStruct((1,) + tuple(feature_shape), jnp.float32)
  out = jax.eval_shape(lambda p, x: model.classify(p, model.features(p, x)), params, spec)
  return int(out.shape[-1]) if len(out.shape) > 1 else 1


def check_task(task: "Task") -> None:
  """Checks a task before anything is compiled: the kind, the model's input and output
  sizes, and every client's labels against the kind.

  Rules: ``binary`` needs labels in {0, 1} and one model output; ``multiclass`` needs
  integer labels in ``[0, K)`` for a model with ``K >= 2`` outputs; ``regression`` needs
  float targets and one output. Only real (unpadded) rows are checked.

  Raises:
    ValueError: naming the set (``train`` or the evaluation set), the bad value and the
      fix; a model that is not a ``FunctionalModel`` (e.g. an ``nnx.Module`` instance).
  """
  import numpy as np
  if task.kind not in KINDS:
    raise ValueError(f"Task {task.name!r}: kind={task.kind!r}; choose one of {KINDS}.")
  if not isinstance(task.train, POOL_TYPES):
    raise ValueError(f"Task {task.name!r}: train must be a ClientData (use "
                     f"from_client_arrays) or a PackedPool (pack_client_arrays), got "
                     f"{type(task.train).__name__}.")
  sets = {"train": task.train}
  for name, data in dict(task.eval_sets).items():
    if not isinstance(data, POOL_TYPES):
      raise ValueError(f"Task {task.name!r}: eval set {name!r} must be a ClientData (use "
                       f"from_client_arrays) or a PackedPool, got {type(data).__name__}.")
    if data.feature_shape != task.train.feature_shape:
      raise ValueError(f"Task {task.name!r}: eval set {name!r} has feature shape "
                       f"{data.feature_shape}, train has {task.train.feature_shape}.")
    sets[name] = data
  if not all(hasattr(task.model, f) for f in ("init", "features", "classify", "apply")):
    raise ValueError(f"Task {task.name!r}: model must be a models.FunctionalModel, got "
                     f"{type(task.model).__name__}; wrap an NNX module with models."
                     "FunctionalModel.from_factory(lambda rngs: Net(..., rngs=rngs)).")
  try:
    k = _output_dim(task.model, task.train.feature_shape)
  except Exception as e:  # a shape error from the model, before any compile
    raise ValueError(f"Task {task.name!r}: the model does not accept inputs of shape "
                     f"{task.train.feature_shape} ({type(e).__name__}: {e}).") from e
  if task.kind in ("binary", "regression") and k != 1:
    raise ValueError(f"Task {task.name!r}: kind {task.kind!r} needs a model with 1 output; "
                     f"this one has {k}. Use kind='multiclass' for {k} classes.")
  if task.kind == "multiclass" and k < 2:
    raise ValueError(f"Task {task.name!r}: kind 'multiclass' needs >= 2 model outputs; "
                     "this one has 1. Use kind='binary' for two classes with one logit.")
  for name, data in sets.items():
    y, n = np.asarray(data.y), np.asarray(data.n)
    real = y if isinstance(data, PackedPool) else y[np.arange(y.shape[1])[None, :] <
                                                    n[:, None]]
    if task.kind == "regression":
      if not np.issubdtype(real.dtype, np.floating):
        raise ValueError(f"Task {task.name!r}: kind 'regression' needs float targets; "
                         f"{name} has {real.dtype} labels. Pass float y, or use a "
                         "classification kind.")
      continue
    if not np.issubdtype(real.dtype, np.integer):
      raise ValueError(f"Task {task.name!r}: kind {task.kind!r} needs integer labels; "
                       f"{name} has {real.dtype}. Pass int y, or use kind='regression'.")
    lo, hi = int(real.min()), int(real.max())
    top = 1 if task.kind == "binary" else k - 1
    if lo < 0 or hi > top:
      allowed = "{0, 1}" if task.kind == "binary" else f"0..{top} ({k} model outputs)"
      fix = (f"use kind='multiclass' with a {hi + 1}-output model" if task.kind == "binary"
             else f"give the model {hi + 1} outputs")
      raise ValueError(f"Task {task.name!r}: {name} labels span {lo}..{hi}, but kind "
                       f"{task.kind!r} allows {allowed}; {fix}.")


@dataclasses.dataclass(frozen=True)
class TaskEntry:
  """A registered task: its builder, the paper it comes from, a one-line summary, and
  ``starting``: where its starting values (the task's defaults and per-algorithm
  settings) come from — the paper, our choice, or a search, naming the data it was scored
  on (``fedjax-inv list --starting``; recorded as ``info['starting_values']``)."""
  name: str
  builder: Callable[..., Task]
  paper: str
  summary: str
  starting: str = ""


_TASKS: dict[str, TaskEntry] = {}


def register_task(name: str, paper: str, summary: str, starting: str = ""):
  """Registers a task builder under ``name`` (:class:`TaskEntry`). Raises ValueError if
  ``name`` is taken."""
  def deco(builder):
    if name in _TASKS:
      raise ValueError(f"task {name!r} is registered twice.")
    _TASKS[name] = TaskEntry(name, builder, paper, summary, starting)
    return builder
  return deco


def task_registry() -> dict[str, TaskEntry]:
  return dict(_TASKS)


def with_validation(task: Task, fraction: float = 0.1, seed: int = 0) -> Task:
  """``task`` with a held-out validation split of its training clients.

  Each training client's real examples are shuffled (``numpy`` generator seeded by
  ``seed``) and split: ``max(1, round(fraction * n_i))`` examples go to validation, the
  rest stay for training. The validation set is ``task.eval_sets['val']`` with **one
  client per training client**, so ``val_mean_client_accuracy`` is the mean of per-client
  (per-domain) validation accuracies: DomainBed's training-domain validation. A task that
  already has a ``'val'`` set (the domain tasks' 90/10 split) is returned unchanged.

  Args:
    task: the task; its ``train`` is ``[N, n_max, ...]`` (a packed pool is padded
      first: the split's sets are resident).
    fraction: validation share of each client, in (0, 0.5].
    seed: seeds the split (use the run's seed: the split is part of the data draw).

  Returns:
    a new ``Task`` with ``train`` ``[N, n_max', ...]`` (``n_i - v_i`` real rows each),
    ``eval_sets = {'val': [N, v_max, ...], **task.eval_sets}`` and
    ``info['validation']`` recording the fraction, seed and sizes.

  Raises:
    ValueError: ``fraction`` outside (0, 0.5]; a training client with fewer than 2
      examples (nothing would be left to train on).

  Source: DomainBed (Gulrajani & Lopez-Paz 2021) §4 "training-domain validation set";
  FedIIR §5 and FedSR §5 hold out 10% of each source domain.
  """
  if "val" in task.eval_sets:
    return task
  if isinstance(fraction, bool) or not 0.0 < float(fraction) <= 0.5:
    raise ValueError(f"validation fraction={fraction!r}; use a number in (0, 0.5] "
                     "(0.1 = DomainBed's 10% of each training client).")
  import numpy as np
  from fedjax_inv.core.data import from_client_arrays
  train = task.train.padded() if isinstance(task.train, PackedPool) else task.train
  x, y, n = (np.asarray(a) for a in (train.x, train.y, train.n))
  rng = np.random.default_rng([int(seed), 0x7A1])
  xs, ys, vxs, vys = [], [], [], []
  for i, ni in enumerate(n):
    if ni < 2:
      raise ValueError(f"Task {task.name!r}: training client {i} has {int(ni)} example(s);"
                       " a validation split needs at least 2 per client.")
    perm = rng.permutation(int(ni))
    v = max(1, int(round(float(fraction) * int(ni))))
    vi, ti = np.sort(perm[:v]), np.sort(perm[v:])
    xs.append(x[i, ti]), ys.append(y[i, ti]), vxs.append(x[i, vi]), vys.append(y[i, vi])
  info = {**task.info, "validation": {"fraction": float(fraction), "seed": int(seed),
                                      "train_sizes": [len(a) for a in ys],
                                      "val_sizes": [len(a) for a in vys]}}
  return dataclasses.replace(task, train=from_client_arrays(xs, ys),
                             eval_sets={"val": from_client_arrays(vxs, vys),
                                        **task.eval_sets}, info=info)


def make_task(name: str, val_fraction: float | None = None, **kw) -> Task:
  """Builds task ``name``.

  Args:
    name: a registered task (``fedjax-inv list``).
    val_fraction: None, or a share in (0, 0.5] of every training client held out as its
      own validation client: :func:`with_validation` with the task's ``seed`` (what
      training-domain validation and Ditto's personalized accuracy read; ``--task-arg
      val_fraction=0.2``). A task that already has a ``'val'`` set keeps it; a task
      whose builder takes ``val_fraction`` itself (the domain tasks' split of every
      source domain) gets it as its own argument.
    **kw: the task's own arguments.

  Raises:
    ValueError: an unknown name, an argument the task does not take (lists the valid
      ones), or a ``val_fraction`` outside (0, 0.5].
  """
  if name not in _TASKS:
    raise ValueError(f"unknown task {name!r}; available: {sorted(_TASKS)}. "
                     "Run `fedjax-inv list` to see them.")
  import inspect
  params = inspect.signature(_TASKS[name].builder).parameters
  if "val_fraction" in params:  # a domain task's own split of every source domain
    if val_fraction is not None:
      kw["val_fraction"] = val_fraction
    val_fraction = None
  if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
    unknown = sorted(set(kw) - set(params))
    if unknown:
      raise ValueError(f"task {name!r} takes no argument(s) {unknown}; its arguments: "
                       f"{sorted(set(params) - {'data_dir', 'source', 'download', 'seed'})}"
                       " and val_fraction (--task-arg NAME=VALUE).")
  if val_fraction is not None and (isinstance(val_fraction, bool) or
                                   not isinstance(val_fraction, (int, float)) or
                                   not 0 < val_fraction <= 0.5):
    raise ValueError(f"val_fraction={val_fraction!r}; use a share in (0, 0.5] of every "
                     "training client (--task-arg val_fraction=0.2).")
  task = _TASKS[name].builder(**kw)
  if _TASKS[name].starting and isinstance(task.info, dict):
    task.info.setdefault("starting_values", _TASKS[name].starting)
  if val_fraction is None:
    return task
  return with_validation(task, float(val_fraction), int(kw.get("seed", 0) or 0))
