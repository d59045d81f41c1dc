"""The `fedjax-inv` command: list, run (outputs and schema), config files, clear errors."""
import json
import math

import pytest

from fedjax_inv import cli


def test_list(capsys):
  assert cli.main(["list"]) == 0
  out = capsys.readouterr().out
  for name in ("colored_mnist", "fedavg", "fedprox", "scaffold", "fedyogi"):
    assert name in out


def test_run_writes_outputs_with_stable_schema(tmp_path, capsys):
  out = tmp_path / "r1"
  rc = cli.main(["run", "--algorithm", "fedavg", "--seeds", "1", "--rounds", "3",
                 "--eval-every", "1", "--out", str(out), "--no-progress"])
  assert rc == 0
  summary = json.loads((out / "summary.json").read_text())
  for k in ("task", "algorithm", "seed", "rounds", "num_clients", "final"):
    assert k in summary
  assert summary["task"] == "colored_mnist" and summary["algorithm"] == "fedavg"
  lines = (out / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(l)["round"] for l in lines] == [1, 2, 3]
  last = json.loads(lines[-1])
  for k in ("train_accuracy", "ood_accuracy", "train_loss", "ood_loss"):
    v = summary["final"][k]
    assert v == last[k], k  # the summary's final metrics are the last evaluation's
    if k.endswith("loss"):
      assert math.isfinite(v) and v > 0, (k, v)  # cross-entropy of finite logits is > 0
    else:
      assert 0.0 <= v <= 1.0, (k, v)  # a fraction of examples
  assert (out / "curves.png").stat().st_size > 1000
  assert "bundled" in summary["data"]["dataset_source"]
  printed = capsys.readouterr().out
  assert "ood_accuracy" in printed and "fedavg" in printed
  assert not list(tmp_path.glob(".r1.tmp-*"))  # nothing half-written left


@pytest.mark.slow
def test_default_run_is_the_three_seed_comparison(tmp_path, capsys):
  out = tmp_path / "cmp"
  assert cli.main(["run", "--rounds", "2", "--out", str(out), "--no-progress"]) == 0
  s = json.loads((out / "summary.json").read_text())
  algos = ["fedavg", "inv_fedavg", "fediir", "fishr_inter_geo"]
  assert s["algorithm"] == algos and s["seed"] == [0, 1, 2]
  assert [r["algorithm"] for r in s["table"]] == algos
  assert all(r["seeds"] == 3 and "ood_accuracy_std" in r for r in s["table"])
  per_run = json.loads((out / "inv_fedavg" / "seed1" / "summary.json").read_text())
  assert per_run["algorithm"] == "inv_fedavg" and per_run["seed"] == 1
  assert "final" in per_run and "ood_accuracy" in per_run["final"]
  assert "± " in (out / "results.md").read_text()
  assert (out / "curves.png").stat().st_size > 1000


def test_config_file_yaml_and_flag_override(tmp_path):
  cfg = tmp_path / "exp.yaml"
  cfg.write_text("algorithm: fedprox\nrounds: 2\nhparams:\n  mu: 0.5\nseed: 3\nseeds: 1\n")
  out = tmp_path / "r2"
  assert cli.main(["run", "--config", str(cfg), "--seed", "4", "--out", str(out),
                   "--no-progress"]) == 0
  s = json.loads((out / "summary.json").read_text())
  assert s["algorithm"] == "fedprox" and s["hparams"]["mu"] == 0.5
  assert s["seed"] == 4 and s["rounds"] == 2


def test_config_is_never_executed_and_unknown_keys_fail(tmp_path, capsys):
  cfg = tmp_path / "bad.json"
  cfg.write_text(json.dumps({"rounds": 1, "learning_rate": 0.1}))
  assert cli.main(["run", "--config", str(cfg)]) == 2
  assert "unknown keys ['learning_rate']" in capsys.readouterr().err
  cfg2 = tmp_path / "evil.yaml"
  cfg2.write_text("rounds: !!python/object/apply:os.system ['echo pwned']\n")
  assert cli.main(["run", "--config", str(cfg2)]) == 2


@pytest.mark.parametrize("argv,msg", [
    (["run", "--algorithm", "fedfoo"], "--algorithm fedfoo: unknown algorithm"),
    (["run", "--task", "imagenet"], "--task imagenet: unknown task"),
    (["run", "--clients-per-round", "7"], "--clients-per-round 7"),
    (["run", "--batch-size", "lots"], "--batch-size 'lots'"),
    (["run", "--execution", "turbo"], "--execution turbo: unknown execution strategy"),
    (["run", "--source", "raw", "--data-dir", "/nonexistent/dir"], "/nonexistent/dir"),
])
def test_bad_flags_fail_fast_with_a_clear_message(argv, msg, capsys):
  assert cli.main(argv) == 2
  assert msg in capsys.readouterr().err


def _resolved(argv):
  parser_args = _parse_run(argv)
  return cli.resolve_run_config(parser_args)


def _parse_run(argv):
  import argparse
  parser = argparse.ArgumentParser()
  cli._run_parser(parser.add_subparsers(dest="command"))
  return parser.parse_args(["run"] + argv)


def test_task_alone_runs_fedavg_with_one_seed_and_says_so(tmp_path, capsys):
  # issue 12: `--task rotated_mnist --rounds 3` ran the 4-algorithm x 3-seed ColoredMNIST
  # comparison (4 min 22 s). Only a bare `fedjax-inv run` runs the comparison.
  cfg = _resolved(["--task", "rotated_mnist", "--rounds", "3"])
  assert cfg["algorithm"] == "fedavg" and cfg["seeds"] == 1
  assert cfg["task"] == "rotated_mnist" and cfg["rounds"] == 3
  plan = cli.describe_plan(cfg)
  assert "rotated_mnist" in plan and "fedavg" in plan and "no --algorithm given" in plan
  # end to end on a fast task: one algorithm, one seed, and the plan is printed first
  out = tmp_path / "lin"
  assert cli.main(["run", "--task", "linear_regression", "--rounds", "2", "--out", str(out),
                   "--no-progress"]) == 0
  s = json.loads((out / "summary.json").read_text())
  assert s["algorithm"] == "fedavg" and s["seed"] == 0 and "table" not in s
  first = capsys.readouterr().out.splitlines()[0]
  assert first.startswith("fedjax-inv run: task linear_regression, algorithm(s) fedavg, "
                          "seed 0 (no --algorithm given")


def test_only_a_bare_run_is_the_comparison(tmp_path):
  bare = _resolved([])
  assert bare["algorithm"] == cli.DEFAULT_RUN["algorithm"] and bare["seeds"] == 3
  assert "default comparison" in cli.describe_plan(bare)
  rounds_only = _resolved(["--rounds", "2"])  # flags that pick no task/algorithm: still it
  assert rounds_only["algorithm"] == cli.DEFAULT_RUN["algorithm"]
  one = _resolved(["--algorithm", "fedprox"])
  assert one["task"] == "colored_mnist" and one["algorithm"] == "fedprox" and one["seeds"] == 1
  assert "no --task given: colored_mnist" in cli.describe_plan(one)
  assert _resolved(["--task", "rotated_mnist", "--seeds", "3"])["seeds"] == 3
  assert _resolved(["--task", "rotated_mnist", "--algorithm", "fedsr,fediir"])[
      "algorithm"] == "fedsr,fediir"
  cfg = tmp_path / "t.yaml"  # a config file that names the task counts like --task
  cfg.write_text("task: rotated_mnist\nrounds: 3\n")
  from_cfg = _resolved(["--config", str(cfg)])
  assert from_cfg["algorithm"] == "fedavg" and from_cfg["seeds"] == 1


def test_run_help_states_the_defaults(capsys):
  with pytest.raises(SystemExit) as exit_:
    cli.main(["run", "--help"])
  assert exit_.value.code == 0  # --help exits cleanly
  out = " ".join(capsys.readouterr().out.split())
  assert "default fedavg (a bare `fedjax-inv run` compares" in out
  assert "default 1 (3 for the bare comparison)" in out


def test_reporting_flags_reach_the_config_keys():
  # engineer R: --select / --last-k / --reporting / --validation map to the config keys
  # that experiment.py reads, typed (last_k an int).
  cfg = _resolved(["--task", "linear_regression", "--select", "min:ood_loss",
                   "--last-k", "5", "--reporting", "none", "--validation", "pooled"])
  assert (cfg["select"], cfg["last_k"], cfg["reporting"], cfg["validation"]) == (
      "min:ood_loss", 5, "none", "pooled")
  assert _resolved(["--rounds", "7", "--lr", "0.25"])["rounds"] == 7
  assert _resolved(["--lr", "0.25"])["lr"] == 0.25
