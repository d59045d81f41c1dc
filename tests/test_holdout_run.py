"""Issue 22: the held-out domain is one more axis of `fedjax-inv run`'s planner and
executor, so `--holdout` works with `--sweep`, `--search`, scoped `--hp`,
`--replicas batched`, `--rounds-per-call`, `--checkpoint-every` and `--resume`. Each run
is checked against a direct `simulation.run` on the task built with that held-out domain
(the reference: no planner, no executor, no batching)."""
import json

import numpy as np
import pytest

from fedjax_inv import cli, models
from fedjax_inv.runner import checkpoint, simulation
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.eval.lodo import SELECTIONS, select_rounds
from fedjax_inv.tasks import make_task, register_task, task_registry
from fedjax_inv.tasks.domainbed import build_domain_task

TASK = "_test_holdout_axis"
DOMAINS = ["d0", "d1", "d2"]
DEFAULTS = dict(rounds=3, eval_every=1, local_steps=2, batch_size=8,
                client_optimizer="sgd", client_lr=0.2, weight_decay=0.0)


def _equal_domains(holdout=0, val_fraction=0.25, seed=0, data_dir=None, source="auto",
                   download=False):
  """3 equal-sized Gaussian domains (every held-out domain gives the same shapes)."""
  rng = np.random.default_rng(11)
  doms = []
  for d in range(3):
    y = rng.integers(0, 2, 32).astype(np.int32)
    x = rng.normal(size=(32, 4)).astype(np.float32) + 0.7 * d
    x[:, 0] += 1.5 * (2 * y - 1)
    doms.append((x, y))
  return build_domain_task(TASK, doms, DOMAINS, holdout=holdout, val_fraction=val_fraction,
                           seed=seed, model=models.mlp(4, (8,), 1), kind="binary",
                           info={"paper": "test"}, defaults=DEFAULTS)


if TASK not in task_registry():
  register_task(TASK, paper="test", summary="3 equal Gaussian domains")(_equal_domains)

BASE = ["run", "--task", TASK, "--no-progress"]


def _rows(out):
  return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def _direct(name, h, seed, **hp):
  """The reference: one `simulation.run` on the task with held-out domain ``h``."""
  kw = {k: v for k, v in DEFAULTS.items() if k not in ("rounds", "eval_every")}
  return simulation.run(make_task(TASK, holdout=h), make_algorithm(name, **{**kw, **hp}),
                        rounds=3, seed=seed, eval_every=1, progress=False)


def _close(history, reference):
  assert [e["round"] for e in history] == [e["round"] for e in reference]
  for x, y in zip(history, reference):
    for k in y:
      np.testing.assert_allclose(x[k], y[k], rtol=2e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_holdout_all_with_a_batched_sweep_equals_direct_runs(tmp_path):
  """--holdout all × --sweep mu=... × 2 seeds as ONE program (--replicas batched,
  --rounds-per-call 3); every run equals its direct run, and the LODO tables follow."""
  out = tmp_path / "sweep"
  assert cli.main(BASE + ["--algorithm", "fedprox", "--holdout", "all", "--seeds", "2",
                          "--sweep", "mu=0.1,0.5", "--replicas", "batched",
                          "--rounds-per-call", "3", "--out", str(out)]) == 0
  s = json.loads((out / "summary.json").read_text())
  assert s["status"] == "ok" and s["holdouts"] == DOMAINS
  assert s["sweep"]["fedprox"]["runs"] == "batched: mu traced"
  assert s["holdouts_run"].startswith("batched") and s["replicas"] == "batched"
  assert len(s["runs"]) == 2 * 3 * 2
  rows = _rows(out)
  for mu in (0.1, 0.5):
    lab = f"fedprox@mu={mu}"
    for h in DOMAINS:
      for seed in (0, 1):
        run = json.loads((out / lab / f"h{h}" / "seed{}".format(seed) / "summary.json")
                         .read_text())
        hist = [{k: v for k, v in r.items() if k not in ("algorithm", "seed", "holdout")}
                for r in rows if (r["algorithm"], r["seed"], r["holdout"]) == (lab, seed, h)]
        ref = _direct("fedprox", h, seed, mu=mu)
        _close(hist, ref.history)
        sel = select_rounds(ref.history)
        for name in SELECTIONS:
          assert run["lodo_selected"][name]["round"] == sel[name]["round"]
  md = (out / "results.md").read_text()
  assert "| fedprox@mu=0.1 |" in md and "| algorithm | d0 | d1 | d2 | avg |" in md


@pytest.mark.slow
def test_holdout_with_search_and_scoped_hp(tmp_path):
  """--search with --holdout and two algorithms, one value scoped to one of them."""
  out = tmp_path / "search"
  assert cli.main(BASE + ["--algorithm", "fedavg,fedprox", "--holdout", "d0,2",
                          "--hp", "fedprox.mu=0.3", "--search", "2", "--rounds", "2",
                          "--replicas", "sequential", "--out", str(out)]) == 0
  s = json.loads((out / "summary.json").read_text())
  assert s["holdouts"] == ["d0", "d2"] and len(s["algorithms"]) == 4
  assert len(s["runs"]) == 4 * 2
  for r in s["runs"]:
    lab = r["algorithm"]
    assert lab.startswith(("fedavg@client_lr=", "fedprox@client_lr="))
    assert r["hparams"]["client_lr"] == float(lab.split("client_lr=")[1].split(",")[0])
    if lab.startswith("fedprox"):
      assert r["hparams"]["mu"] == 0.3  # fixed by --hp, not searched
  assert "mu" not in s["search"]["fedprox"]["space"]


@pytest.mark.slow
@pytest.mark.parametrize("replicas", ["sequential", "batched"])
def test_holdout_resume_continues_from_the_checkpoint(tmp_path, monkeypatch, replicas):
  """Ctrl-C in the middle of a --holdout run with --checkpoint-every 1; --resume keeps
  the finished runs, continues the interrupted one from its checkpoint, and the results
  equal an uninterrupted run exactly."""
  from fedjax_inv.runner import replicas as replicas_lib
  args = BASE + ["--algorithm", "fedavg", "--holdout", "all", "--seeds", "2",
                 "--checkpoint-every", "1", "--replicas", replicas]
  ref = tmp_path / "ref"
  assert cli.main(args + ["--out", str(ref)]) == 0
  target = (simulation, "run") if replicas == "sequential" else (replicas_lib,
                                                                  "run_replicas")
  real = getattr(*target)

  def interrupted(*a, callback=None, **k):
    def cb(*args):
      callback(*args)
      entry = args[-1]
      if entry["round"] == 2 and (replicas == "batched" or
                                  a[0].info["holdout"] == "d1"):
        raise KeyboardInterrupt
    return real(*a, callback=cb, **k)
  monkeypatch.setattr(*target, interrupted)
  out = tmp_path / "exp"
  assert cli.main(args + ["--out", str(out)]) == 130
  if replicas == "sequential":
    assert (out / "fedavg" / "hd0" / "seed1" / "summary.json").exists()  # kept
    ckpt = out / "fedavg" / "hd1" / "seed0" / "checkpoint"
  else:
    ckpt = next(p for p in (out / "fedavg").iterdir() if p.name.startswith("batch-"))
    ckpt = ckpt / "checkpoint"
  assert checkpoint.latest_checkpoint(ckpt) == 2
  starts = []

  def counting(*a, **k):
    starts.append(checkpoint.latest_checkpoint(k["checkpoint_dir"]))
    return real(*a, **k)
  monkeypatch.setattr(*target, counting)
  assert cli.main(["run", "--resume", str(out), "--no-progress"]) == 0
  # sequential: d1 seed 0 from round 2, then three fresh runs; batched: the batch from 2
  assert starts == ([2, None, None, None] if replicas == "sequential" else [2])
  assert not ckpt.exists()
  a = json.loads((out / "summary.json").read_text())
  b = json.loads((ref / "summary.json").read_text())
  assert a["status"] == "ok" and a["table"] == b["table"]
  key = lambda r: (r["holdout"], r["seed"], r["round"])  # noqa: E731
  assert sorted(_rows(out), key=key) == sorted(_rows(ref), key=key)
