"""What a run reports beyond the pooled per-round metrics: model selection, last-k
averages, ranking and fairness metrics — one opt-in/opt-out :class:`Reporting` spec.

``fedjax_inv.runner.simulation.run(task, alg, rounds=..., reporting=...)`` takes:

* ``reporting='auto'`` (default) — :func:`for_task`: the protocol of the paper the task
  comes from (FedILC tasks: report at the round of lowest OOD loss, AUROC/AUPRC and
  fairness per round; FedGMA tasks: average over the last 20 rounds; domain tasks:
  training-domain validation). ``None`` / ``'none'`` — none of it.
* a :class:`Reporting`, or a dict of its fields, e.g.
  ``{'select': ['min:ood_loss'], 'last_k': 20, 'ranking': ['ood']}``.

What comes back (``RunResult`` and ``summary.json``):

* ``selected[rule]`` — the history entry (every metric, plus ``round``) of the evaluated
  round picked by each selection rule ``'min:<metric>'`` / ``'max:<metric>'`` (ties → the
  earliest round; only rounds ``>= select_from`` compete); ``selected_params[rule]`` — an
  independent copy of the global model of that round (never a live reference to the
  last model, the official FedILC code's bug).
* ``last_k_mean`` — every metric averaged over the evaluations of the last ``last_k``
  rounds (the evaluation schedule includes each of them; earlier rounds keep
  ``eval_every``): FedGMA Tables 1-2's "average over the last 20 rounds".
* per-round history keys ``<set>_auroc``, ``<set>_auprc`` (continuous, = scikit-learn's
  ``roc_auc_score`` / ``average_precision_score``) and ``<set>_auroc_thresholded``,
  ``<set>_auprc_thresholded`` (the official FedILC code's 0/1-prediction variant) for each
  set in ``ranking``; ``<set>_accuracy_variance`` / ``<set>_accuracy_entropy`` across the
  clients of each set in ``fairness``, and ``<group>_accuracy_variance`` /
  ``<group>_accuracy_entropy`` across the pooled accuracies of the sets of each
  ``fairness_groups`` entry (FedILC Table 3 over Rotated-CIFAR10's 9 sub-environments).

Table columns (``fedjax_inv.runner.outputs``): ``'ood_accuracy'`` is the last round,
``'ood_accuracy@min:ood_loss'`` the selected round, ``'ood_accuracy@last20'`` the
last-20 mean (see :func:`column_value`).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import numpy as np

from fedjax_inv.eval import metrics

__all__ = ["Reporting", "column_value", "eval_rounds", "for_task", "history_keys",
           "last_k_mean", "resolve", "round_extras", "select_index", "select_rounds_by"]

_RULE = re.compile(r"^(min|max):([A-Za-z0-9_.\-]+)$")
_LAST = re.compile(r"^last(\d+)$")


def _tuple(x, what: str) -> tuple:
  if x is None:
    return ()
  if isinstance(x, str):
    x = [a.strip() for a in x.split(",") if a.strip()]
  try:
    return tuple(str(a) for a in x)
  except TypeError:
    raise ValueError(f"Reporting.{what}={x!r}; pass a list of names (or a "
                     "comma-separated string).") from None


@dataclasses.dataclass(frozen=True)
class Reporting:
  """Opt-in extras of a run (all off by default; ``for_task`` picks per-task defaults).

  Attributes:
    select: selection rules ``'min:<metric>'`` / ``'max:<metric>'`` over the evaluated
      rounds, ``<metric>`` a history key such as ``ood_loss`` (FedILC §5.2: "when the OOD
      test loss is lowest") or ``val_mean_client_accuracy`` (DomainBed / FedIIR
      training-domain validation: the mean of the per-domain validation accuracies).
    select_from: only evaluated rounds ``>= select_from`` (1-based) compete; if none is,
      all evaluated rounds do and the selected entry says ``select_from_ignored``. The
      official FedILC code skips its first 6 rounds (``round_idx > 5``): 7.
    last_k: average every metric over the last ``last_k`` rounds (each one evaluated);
      0 = off. FedGMA Tables 1-2: 20. Capped at ``rounds``.
    ranking: evaluation sets of a binary task that get AUROC/AUPRC per evaluated round
      (both classes must occur in each).
    fairness: sets (``'train'`` or evaluation sets) that get the variance and entropy of
      their clients' accuracies per evaluated round (classification tasks).
    fairness_groups: ``{group: [eval set, ...]}``; each group gets the variance and
      entropy of its sets' pooled accuracies (FedILC Table 3's 9 sub-environments).
    keep_params: keep a copy of the global model of every selected round
      (``RunResult.selected_params``).
    note: provenance, written to ``summary.json``.
  """
  select: tuple = ()
  select_from: int = 1
  last_k: int = 0
  ranking: tuple = ()
  fairness: tuple = ()
  fairness_groups: dict = dataclasses.field(default_factory=dict)
  keep_params: bool = True
  note: str = ""

  def __post_init__(self):
    object.__setattr__(self, "select", _tuple(self.select, "select"))
    object.__setattr__(self, "ranking", _tuple(self.ranking, "ranking"))
    object.__setattr__(self, "fairness", _tuple(self.fairness, "fairness"))
    groups = self.fairness_groups or {}
    if not isinstance(groups, dict):
      raise ValueError(f"Reporting.fairness_groups={groups!r}; pass a dict "
                       "{group name: [eval set, ...]}.")
    object.__setattr__(self, "fairness_groups",
                       {str(g): _tuple(v, f"fairness_groups[{g!r}]")
                        for g, v in groups.items()})
    for rule in self.select:
      if not _RULE.match(rule):
        raise ValueError(f"Reporting.select: bad rule {rule!r}; write 'min:<metric>' or "
                         "'max:<metric>', e.g. 'min:ood_loss'.")
    for name, v in (("select_from", self.select_from), ("last_k", self.last_k)):
      if isinstance(v, bool) or int(v) != v or v < (1 if name == "select_from" else 0):
        raise ValueError(f"Reporting.{name}={v!r}; it must be an integer >= "
                         f"{1 if name == 'select_from' else 0}.")
    object.__setattr__(self, "select_from", int(self.select_from))
    object.__setattr__(self, "last_k", int(self.last_k))

  def to_dict(self) -> dict:
    """JSON-ready fields (for ``summary.json``)."""
    d = dataclasses.asdict(self)
    d["select"] = list(self.select)
    d["ranking"] = list(self.ranking)
    d["fairness"] = list(self.fairness)
    d["fairness_groups"] = {g: list(v) for g, v in self.fairness_groups.items()}
    return d

  def __bool__(self) -> bool:
    return bool(self.select or self.last_k or self.ranking or self.fairness
                or self.fairness_groups)


_FIELDS = {f.name for f in dataclasses.fields(Reporting)}


def resolve(reporting, task) -> Reporting:
  """``'auto'`` → :func:`for_task`; ``None`` / ``'none'`` / ``False`` → off; a dict →
  ``Reporting(**dict)``; a :class:`Reporting` as is.

  Raises:
    ValueError: unknown dict keys or a value of another type.
  """
  if isinstance(reporting, Reporting):
    return reporting
  if reporting is None or reporting is False or (
      isinstance(reporting, str) and reporting.lower() in ("none", "off")):
    return Reporting()
  if isinstance(reporting, str) and reporting == "auto":
    return for_task(task)
  if isinstance(reporting, dict):
    unknown = sorted(set(reporting) - _FIELDS)
    if unknown:
      raise ValueError(f"reporting: unknown keys {unknown}; valid keys: {sorted(_FIELDS)}.")
    return Reporting(**reporting)
  raise ValueError(f"reporting={reporting!r}; pass 'auto', None, a dict or a Reporting.")


def for_task(task) -> Reporting:
  """The reporting protocol of the paper ``task`` comes from.

  * ``task.info['reporting']`` (a dict of :class:`Reporting` fields), when a task
    builder sets one, wins.
  * FedILC tasks (``info['paper']`` names FedILC: colored_mnist_fedilc, eicu,
    rotated_cifar10): select ``min:ood_loss`` from round 7 (FedILC §5.2 reports every
    metric "when the OOD test loss is lowest"; the official code skips rounds 1-6);
    AUROC/AUPRC on every binary evaluation set with both classes (Table 4); fairness
    over the training clients and every multi-client set, and over the sub-environment
    sets ``client<i>_rot<angle>`` as group ``subenvs`` (Table 3).
  * FedGMA tasks: ``last_k=20`` (Tables 1-2: "average ... over the last 20 rounds").
  * Domain tasks (``info['domains']`` with 'val' and 'ood' sets): training-domain
    validation ``max:val_mean_client_accuracy`` (DomainBed / FedIIR: the mean of the
    per-domain validation accuracies; ``val_accuracy`` if 'val' has one client).
  * Anything else: nothing.
  """
  info = getattr(task, "info", None) or {}
  spec = info.get("reporting")
  if spec is not None:
    return resolve(spec, task)
  paper = str(info.get("paper", ""))
  sets = dict(getattr(task, "eval_sets", {}) or {})
  classif = task.kind != "regression"
  if "FedILC" in paper:
    ranking = []
    if task.kind == "binary":
      for name, data in sets.items():
        y = np.asarray(data.y)[np.asarray(data.mask()).astype(bool)]
        if 0 < int(y.sum()) < y.size:
          ranking.append(name)
    fairness, groups = [], {}
    if classif:
      fairness = [n for n, d in {"train": task.train, **sets}.items() if d.num_clients > 1]
      sub = [n for n in sets if re.match(r"^client\d+_rot", n)]
      if len(sub) > 1:
        groups = {"subenvs": sub}
    return Reporting(select=("min:ood_loss",) if "ood" in sets else (), select_from=7,
                     ranking=ranking, fairness=fairness, fairness_groups=groups,
                     note="FedILC §5.2 (Tables 2-6 at the round of lowest OOD test loss; "
                          "official code: rounds after the 6th)")
  if "FedGMA" in paper:
    return Reporting(last_k=20, note="FedGMA Tables 1-2 (average over the last 20 rounds)")
  if info.get("domains") and "val" in sets and "ood" in sets and classif:
    key = ("val_mean_client_accuracy" if sets["val"].num_clients > 1 else "val_accuracy")
    return Reporting(select=(f"max:{key}",),
                     note="training-domain validation (DomainBed; FedIIR §5): mean of the "
                          "per-domain validation accuracies")
  return Reporting()


def history_keys(task, reporting: Reporting) -> set:
  """Every key a history entry of ``run(task, ..., reporting=reporting)`` has (computed
  without compiling anything; used to check selection rules up front).

  Returns:
    a set of strings: ``round``, ``train_objective``, the ``summarize`` keys of
    ``train`` and every evaluation set, and the ranking / fairness keys of ``reporting``.
  """
  from fedjax_inv.eval import summary_keys
  keys = {"round", "train_objective"}
  for name, data in {"train": task.train, **dict(task.eval_sets)}.items():
    keys |= summary_keys(task.kind, name, data.num_clients)
  for s in reporting.ranking:
    keys |= {f"{s}_auroc", f"{s}_auprc", f"{s}_auroc_thresholded", f"{s}_auprc_thresholded"}
  for s in list(reporting.fairness) + list(reporting.fairness_groups):
    keys |= {f"{s}_accuracy_variance", f"{s}_accuracy_entropy"}
  return keys


def check(reporting: Reporting, task) -> None:
  """Checks ``reporting`` against ``task`` before anything is compiled.

  Raises:
    ValueError: a selection rule on a metric the run will not record (the message lists
      the recorded ones), a ranking set of a non-binary task or holding one class,
      fairness on a regression task, an unknown set, or a fairness group of < 2 sets.
  """
  sets = dict(task.eval_sets)
  for s in reporting.ranking:
    if task.kind != "binary":
      raise ValueError(f"Reporting.ranking={list(reporting.ranking)}: AUROC/AUPRC need a "
                       f"binary task; {task.name!r} is {task.kind!r}. Use ranking=[].")
    if s not in sets:
      raise ValueError(f"Reporting.ranking: unknown evaluation set {s!r}; the task has "
                       f"{sorted(sets)}.")
    y = np.asarray(sets[s].y)[np.asarray(sets[s].mask()).astype(bool)]
    if not 0 < int(y.sum()) < y.size:
      raise ValueError(f"Reporting.ranking: evaluation set {s!r} holds one class only; "
                       "AUROC/AUPRC are undefined there. Drop it from ranking.")
  if (reporting.fairness or reporting.fairness_groups) and task.kind == "regression":
    raise ValueError("Reporting.fairness: accuracy fairness needs a classification task; "
                     f"{task.name!r} is a regression task. Use fairness=[].")
  for s in reporting.fairness:
    if s != "train" and s not in sets:
      raise ValueError(f"Reporting.fairness: unknown set {s!r}; use 'train' or one of "
                       f"{sorted(sets)}.")
  for g, members in reporting.fairness_groups.items():
    bad = [m for m in members if m not in sets and m != "train"]
    if bad or len(members) < 2:
      raise ValueError(f"Reporting.fairness_groups[{g!r}]={list(members)}: give >= 2 of "
                       f"'train', {sorted(sets)}" + (f" (unknown: {bad})" if bad else "")
                       + ".")
  keys = history_keys(task, reporting)
  for rule in reporting.select:
    metric = _RULE.match(rule).group(2)
    if metric not in keys:
      raise ValueError(f"Reporting.select: rule {rule!r} names {metric!r}, which this run "
                       f"does not record; choose one of {sorted(keys - {'round'})}.")


def eval_rounds(rounds: int, eval_every: int, last_k: int = 0) -> list[int]:
  """The evaluated rounds (1-based, increasing): every ``eval_every``-th round, each of
  the last ``min(last_k, rounds)`` rounds, and always the last round.

  Example: ``eval_rounds(100, 10, 20) == [10, 20, ..., 70, 80, 81, 82, ..., 100]`` —
  28 evaluations instead of 100.

  Raises:
    ValueError: ``rounds < 1``, ``eval_every < 1`` or ``last_k < 0``.
  """
  if rounds < 1 or eval_every < 1 or last_k < 0:
    raise ValueError(f"eval_rounds: rounds={rounds}, eval_every={eval_every}, "
                     f"last_k={last_k}; need rounds >= 1, eval_every >= 1, last_k >= 0.")
  out = set(range(eval_every, rounds + 1, eval_every))
  out |= set(range(max(1, rounds - last_k + 1), rounds + 1))
  out.add(rounds)
  return sorted(out)


def _values(history: Sequence[dict], key: str, sign: float) -> np.ndarray:
  v = np.asarray([float(h[key]) if h.get(key) is not None else np.nan for h in history])
  return np.where(np.isfinite(v), sign * v, np.inf)  # NaN / missing never win


def select_index(history: Sequence[dict], rule: str, select_from: int = 1) -> tuple[int, bool]:
  """Index into ``history`` of the round picked by ``rule`` (``'min:<m>'`` / ``'max:<m>'``;
  ties → earliest; NaN never wins), among entries with ``round >= select_from`` — or all
  entries if none qualifies. Returns ``(index, select_from_ignored)``.

  Raises:
    ValueError: empty history, a malformed rule, or a metric no entry has.

  Source: FedILC §5.2 (lowest OOD loss), DomainBed ``IIDAccuracySelectionMethod``
  (highest training-domain validation accuracy).
  """
  m = _RULE.match(rule or "")
  if not m:
    raise ValueError(f"bad selection rule {rule!r}; write 'min:<metric>' or 'max:<metric>'.")
  if not history:
    raise ValueError("select_index: the history is empty; evaluate at least one round.")
  mode, key = m.groups()
  if not any(key in h for h in history):
    raise ValueError(f"selection rule {rule!r}: no history entry has {key!r} (keys: "
                     f"{sorted(history[0])}).")
  score = _values(history, key, 1.0 if mode == "min" else -1.0)
  eligible = np.asarray([h["round"] >= select_from for h in history])
  ignored = not eligible.any()
  if not ignored:
    score = np.where(eligible, score, np.inf)
  return int(np.argmin(score)), ignored


def select_rounds_by(history: Sequence[dict], rules: Sequence[str],
                     select_from: int = 1) -> dict:
  """``{rule: entry}`` with the selected history entry (a copy; ``round`` included, plus
  ``select_from_ignored: True`` when no round >= ``select_from`` was evaluated)."""
  out = {}
  for rule in rules:
    i, ignored = select_index(history, rule, select_from)
    out[rule] = dict(history[i])
    if ignored:
      out[rule]["select_from_ignored"] = True
  return out


def last_k_mean(history: Sequence[dict], k: int, rounds: int | None = None) -> dict:
  """Mean of every numeric metric over the entries of the last ``k`` rounds
  (``round > rounds - k``; ``rounds`` defaults to the last entry's round).

  Returns:
    ``{'k', 'first_round', 'last_round', 'evaluations', <metric>: mean, ...}`` — ``k``
    the window actually used (``min(k, rounds)``), ``evaluations`` how many entries
    fell inside (``k`` when the schedule came from :func:`eval_rounds`).

  Raises:
    ValueError: ``k < 1`` or no entry in the window.

  Source: FedGMA §5, Tables 1-2 ("average test performance over the last 20 rounds").
  """
  if int(k) != k or k < 1:
    raise ValueError(f"last_k_mean: k={k!r}; pass an integer >= 1.")
  if not history:
    raise ValueError("last_k_mean: the history is empty.")
  rounds = int(history[-1]["round"] if rounds is None else rounds)
  k = min(int(k), rounds)
  window = [h for h in history if h["round"] > rounds - k]
  if not window:
    raise ValueError(f"last_k_mean: no evaluated round in the last {k} of {rounds}; "
                     "evaluate them (run(..., reporting={'last_k': k}) does).")
  out = {"k": k, "first_round": int(window[0]["round"]),
         "last_round": int(window[-1]["round"]), "evaluations": len(window)}
  for key in window[-1]:
    if key == "round":
      continue
    vals = [h.get(key) for h in window]
    if all(isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
           for v in vals):
      out[key] = float(np.mean(np.asarray(vals, np.float64)))
  return out


def round_extras(per_client: dict, params, task, reporting: Reporting,
                 predict_fn=None) -> dict:
  """Per-round ranking and fairness metrics.

  Args:
    per_client: ``{set name: evaluator output}`` (``'train'`` and every evaluation set;
      arrays ``[N]`` over that set's clients, ``fedjax_inv.eval.build_evaluator``).
    params: the global model (for ``ranking``).
    task: the task.
    reporting: which metrics.
    predict_fn: ``fedjax_inv.eval.metrics.build_predict(...)`` result; needed when
      ``reporting.ranking`` is non-empty.

  Returns:
    ``{<set>_auroc, <set>_auprc, <set>_auroc_thresholded, <set>_auprc_thresholded}`` per
    ranking set (pooled over its clients; scores = logits, threshold 0 = probability
    0.5) and ``{<name>_accuracy_variance, <name>_accuracy_entropy}`` per fairness set /
    group (population variance of accuracies in [0, 1]; entropy in nats of the
    normalized accuracies, NaN if all are 0).

  Source: FedILC §5.2, Tables 3-4; q-FFL (Li et al. 2020) for the fairness measures.
  """
  out = {}
  sets = {"train": task.train, **dict(task.eval_sets)}
  for s in reporting.ranking:
    logits, mask = predict_fn(params, sets[s])
    real = mask.astype(bool)
    sc = logits[..., 0][real].astype(np.float64)
    y = np.asarray(sets[s].y)[real].astype(np.int64)
    out[f"{s}_auroc"] = metrics.auroc(sc, y)
    out[f"{s}_auprc"] = metrics.auprc(sc, y)
    out[f"{s}_auroc_thresholded"] = metrics.auroc_thresholded(sc, y)
    out[f"{s}_auprc_thresholded"] = metrics.auprc_thresholded(sc, y)

  def fair(name, accs):
    out[f"{name}_accuracy_variance"] = metrics.accuracy_variance(accs)
    accs = np.asarray(accs, np.float64)
    out[f"{name}_accuracy_entropy"] = (metrics.accuracy_entropy(accs) if accs.sum() > 0
                                       else float("nan"))

  for s in reporting.fairness:
    fair(s, metrics.per_client_accuracy(per_client[s]))
  for g, members in reporting.fairness_groups.items():
    fair(g, [per_client[m]["correct"].sum() / max(per_client[m]["n"].sum(), 1)
             for m in members])
  return out


def column_value(run: dict, column: str) -> Any:
  """Value of a table column for one run summary (``None`` if it has none).

  ``'<metric>'`` → ``run['final'][metric]`` (last round); ``'<metric>@<rule>'`` →
  ``run['selected'][rule][metric]`` (e.g. ``'ood_accuracy@min:ood_loss'``);
  ``'<metric>@last<k>'`` → ``run['last_k_mean'][metric]`` when that window is ``k``
  rounds.
  """
  if "@" not in column:
    return (run.get("final") or {}).get(column)
  metric, where = column.split("@", 1)
  m = _LAST.match(where)
  if m:
    win = run.get("last_k_mean") or {}
    return win.get(metric) if win.get("k") == int(m.group(1)) else None
  return ((run.get("selected") or {}).get(where) or {}).get(metric)
