"""`fedjax-inv` help and name errors come from the registries.

The help of `--algorithm`, `--task`, `--aggregator`, `--attack` and `--sweep` lists
exactly what is registered when the parser is built (a registry entry added here shows
up), a bad name fails with one line naming the flag and the closest registered name
(exit code 2, before anything is planned or compiled), `--sweep point` is said only of
values that came from `--sweep`, `--seed` / `--seeds` say where the data comes from, and
no help or message uses insider wording. In-process: `cli.main`, no subprocess.
"""
import ast
import pathlib
import re

import pytest

from fedjax_inv import cli
from fedjax_inv.runner import config, grid
from fedjax_inv.aggregation import robust
from fedjax_inv.algorithms import base, registry, schema
from fedjax_inv.core import adversary
from fedjax_inv.core import algorithm as core_algorithm
from fedjax_inv.core.algorithm import Entry
from fedjax_inv.tasks import base as task_base
from fedjax_inv.tasks import task_registry

INSIDER = re.compile(r"\bissue \d+|\bsession\b|main job|trial 0|\(issue", re.I)


def _help(*argv) -> str:
  """The `--help` text of `fedjax-inv *argv`, its whitespace collapsed (argparse wraps)."""
  import contextlib
  import io
  out = io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
    cli.main([*argv, "--help"])
  assert e.value.code == 0
  return " ".join(out.getvalue().split())


def _listed(text: str, before: str, after: str) -> list:
  """The comma-separated names between `before` and `after` ('' = the end) in `text`."""
  m = re.search(re.escape(before) + r"(.*?)" + (re.escape(after) if after else "$"), text)
  assert m, (before, after, text[:300])
  return m.group(1).split(", ")


def _schema_names() -> list:  # what --hp / --sweep accept, read from the schema itself
  return sorted({n for n, p in schema.SCHEMA.items() if p.kind != "any"}
                | set(schema.ALIASES))


# flag -> (argv of the help, before, after, the registry's names now)
HELP = {
    "run --algorithm": (["run"], "or a comma-separated list to compare: ",
                        "; default fedavg", lambda: sorted(registry())),
    "run --task": (["run"], "task name (fedjax-inv list describes them): ",
                   "; default colored_mnist", lambda: sorted(task_registry())),
    "run --aggregator": (["run"], "server aggregation rule: ", "; or a robust one",
                         lambda: sorted(base.AGGREGATORS)),
    "run --aggregator (robust)": (["run"], "trimmed_mean:beta=0.1): ",
                                  "; default: the algorithm's",
                                  lambda: sorted(robust.ROBUST)),
    "run --attack": (["run"], "malicious clients: ", ", by --attack-fraction",
                     lambda: sorted(adversary.ATTACKS)),
    "run --sweep": (["run"], "NAME (lr = client_lr): ", ". The points run batched",
                    _schema_names),
    "tune --task": (["tune"], "--task TASK task name (fedjax-inv list): ",
                    " --algorithm ALGORITHM", lambda: sorted(task_registry())),
    "tune --algorithm": (["tune"], "comma-separated algorithm names: ", " --trials",
                         lambda: sorted(registry())),
    "hparams ALGORITHM": (["hparams"], "registered algorithm name (fedjax-inv list): ",
                          " options:", lambda: sorted(registry())),
    "hparams --task": (["hparams"], "also show this task's values for the algorithm: ",
                       "", lambda: sorted(task_registry())),
}


def _add_entry(flag: str, monkeypatch) -> str:
  """Registers one more name in `flag`'s registry (undone after the test); returns it."""
  if "--algorithm" in flag or "ALGORITHM" in flag:
    monkeypatch.setitem(core_algorithm._REGISTRY, "zz_new_algorithm",
                        Entry("zz_new_algorithm", lambda **k: None, "-", "-"))
    return "zz_new_algorithm"
  if "--task" in flag:
    monkeypatch.setitem(task_base._TASKS, "zz_new_task",
                        task_base.TaskEntry("zz_new_task", lambda **k: None, "-", "-"))
    return "zz_new_task"
  if flag == "run --aggregator":
    monkeypatch.setattr(base, "AGGREGATORS", base.AGGREGATORS + ("zz_new_rule",))
    return "zz_new_rule"
  if flag == "run --aggregator (robust)":
    monkeypatch.setattr(robust, "ROBUST", robust.ROBUST + ("zz_new_robust",))
    return "zz_new_robust"
  if flag == "run --attack":
    monkeypatch.setattr(adversary, "ATTACKS", adversary.ATTACKS + ("zz_new_attack",))
    return "zz_new_attack"
  monkeypatch.setitem(schema.SCHEMA, "zz_new_knob", schema.Param("nonneg"))
  return "zz_new_knob"


@pytest.mark.parametrize("flag", list(HELP))
def test_help_lists_exactly_the_registered_names(flag, monkeypatch):
  argv, before, after, names = HELP[flag]
  assert _listed(_help(*argv), before, after) == names()
  # computed when the parser is built: a new registry entry is listed, none is missed
  new = _add_entry(flag, monkeypatch)
  listed = _listed(_help(*argv), before, after)
  assert new in listed and listed == names()


def test_hparams_lists_what_the_algorithm_reads_in_the_round_as_traced(capsys):
  """The traced names are the algorithm's own (``Algorithm.traced``), not a list kept
  beside it: Ditto's λ and the rates, FedGMA's τ, and no μ for FedAvg."""
  from fedjax_inv import cli

  def traced(alg):
    assert cli.main(["hparams", alg]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("traced"))
    return line.split(": ", 1)[1].split(", ")

  assert traced("ditto") == ["client_lr", "ditto_lambda", "server_lr"]
  assert traced("fedgma") == ["client_lr", "server_lr", "tau"]
  assert traced("fedavg") == ["client_lr", "server_lr"]
  assert "--sweep" in _help("run") and "lists them as traced" in _help("run")


def test_hp_help_points_to_the_sweep_names():
  assert "NAME as for --sweep" in _help("run")
  assert "NAME as for `fedjax-inv run --sweep`" in _help("tune")


def _no_run(monkeypatch):
  """Makes planning, tuning, the hparams listing and compiling fail if reached."""
  from fedjax_inv.runner import experiment, simulation, tuning
  from fedjax_inv.algorithms import hparams

  def reached(*a, **k):
    raise AssertionError("a bad name got past the checks")
  monkeypatch.setattr(experiment, "run_experiment", reached)
  monkeypatch.setattr(simulation, "build_round", reached)
  monkeypatch.setattr(tuning, "tune_row", reached)
  monkeypatch.setattr(hparams, "defaults", reached)


T = ["run", "--task", "linear_regression", "--rounds", "1", "--no-progress"]
TUNE = ["tune", "--rounds", "1", "--out", "never_written"]
BAD = [  # (argv, the one line after "fedjax-inv: error: ")
    (["run", "--algorithm", "fedavgg"],
     "--algorithm fedavgg: unknown algorithm; did you mean fedavg?"),
    (["run", "--algorithm", "fedavg,fedprx"],
     "--algorithm fedprx: unknown algorithm; did you mean fedprox?"),
    (["run", "--task", "colored_mnistt"],
     "--task colored_mnistt: unknown task; did you mean colored_mnist?"),
    (T + ["--aggregator", "krumm"],
     "--aggregator krumm: unknown aggregator; did you mean krum?"),
    (T + ["--aggregator", "krumm", "--sweep", "client_lr=0.1,0.2"],
     "--aggregator krumm: unknown aggregator; did you mean krum?"),
    (T + ["--hp", "aggregator=medain"],
     "--hp aggregator=medain: unknown aggregator; did you mean median?"),
    (T + ["--attack", "sign_flp"],
     "--attack sign_flp: unknown attack; did you mean sign_flip?"),
    (T + ["--hp", "muu=3"], "--hp muu: unknown hyperparameter; did you mean mu?"),
    (T + ["--hp", "fedavg.muu=3"], "--hp muu: unknown hyperparameter; did you mean mu?"),
    (T + ["--sweep", "ditto_lamda=0.1,1"],
     "--sweep ditto_lamda: unknown hyperparameter; did you mean ditto_lambda?"),
    (T + ["--execution", "vmapp"],
     "--execution vmapp: unknown execution strategy; did you mean vmap?"),
    (T + ["--replicas", "batchd"], "--replicas batchd: unknown replica mode; did you mean "
     "batched?"),
    (TUNE + ["--task", "linear_regresion", "--algorithm", "fedavg"],
     "--task linear_regresion: unknown task; did you mean linear_regression?"),
    (TUNE + ["--task", "linear_regression", "--algorithm", "fedavg,fedproxx"],
     "--algorithm fedproxx: unknown algorithm; did you mean fedprox?"),
    (TUNE + ["--task", "linear_regression", "--algorithm", "fedprox", "--hp", "mu_=0.1"],
     "--hp mu_: unknown hyperparameter; did you mean mu?"),
    (["hparams", "fedavgg"], "hparams fedavgg: unknown algorithm; did you mean fedavg?"),
    (["hparams", "fedavg", "--task", "pacss"],
     "--task pacss: unknown task; did you mean pacs?"),
]


@pytest.mark.parametrize("argv,line", BAD, ids=[" ".join(b[0])[-40:] for b in BAD])
def test_bad_name_one_line_naming_the_flag_exit_2(argv, line, monkeypatch, tmp_path,
                                                  capsys):
  monkeypatch.chdir(tmp_path)
  _no_run(monkeypatch)
  assert cli.main(argv) == 2
  out, err = capsys.readouterr()
  assert err.splitlines() == ["fedjax-inv: error: " + line]
  assert out == ""  # not even the plan line: the names are checked first
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv,flag,names", [
    (["run", "--algorithm", "zzzz"], "--algorithm zzzz: unknown algorithm",
     lambda: sorted(registry())),
    (["run", "--task", "zzzz"], "--task zzzz: unknown task",
     lambda: sorted(task_registry())),
    (T + ["--attack", "zzzz"], "--attack zzzz: unknown attack",
     lambda: sorted(adversary.ATTACKS)),
    (T + ["--sweep", "zzzz=1,2"], "--sweep zzzz: unknown hyperparameter", _schema_names),
])
def test_no_close_name_lists_the_choices(argv, flag, names, monkeypatch, capsys):
  _no_run(monkeypatch)
  assert cli.main(argv) == 2
  assert capsys.readouterr().err.splitlines() == [
      f"fedjax-inv: error: {flag}; choose one of {', '.join(names())}."]


def test_aggregator_error_lists_base_then_robust_names(monkeypatch, capsys):
  _no_run(monkeypatch)
  assert cli.main(T + ["--aggregator", "zzzz"]) == 2
  names = sorted(base.AGGREGATORS) + sorted(robust.ROBUST)
  assert capsys.readouterr().err.strip() == (
      f"fedjax-inv: error: --aggregator zzzz: unknown aggregator; choose one of "
      f"{', '.join(names)}.")


def test_sweep_point_prefix_only_for_values_from_the_sweep():
  def make(point):
    if point.get("mu") == -1 or point.get("shared_bad"):
      raise ValueError("refused")
    return object()
  with pytest.raises(ValueError, match=r"^--sweep point fedprox@mu=-1: refused$"):
    grid.plan("fedprox", make, [{"mu": 0.1}, {"mu": -1}])

  def refuse_all(point):
    raise ValueError("aggregator='krumm'; refused")
  for pts in ([{}], [{"mu": 0.1}, {"mu": 0.2}]):  # the bad value is not the point's
    with pytest.raises(ValueError, match=r"^aggregator='krumm'; refused$"):
      grid.plan("fedprox", refuse_all, pts)


def test_cli_shared_setting_error_is_not_blamed_on_the_sweep(monkeypatch, tmp_path, capsys):
  # the task is built (fast), the algorithms refused before anything compiles
  from fedjax_inv.runner import simulation
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(simulation, "build_round", lambda *a, **k: pytest.fail("compiled"))
  assert cli.main(T + ["--hp", "mu=1"]) == 2
  err = capsys.readouterr().err
  assert "unknown hyperparameters ['mu']" in err and "--sweep point" not in err
  assert cli.main(T + ["--sweep", "client_lr=0.1,0.2", "--aggregator", "krum:f=9"]) == 2
  err = capsys.readouterr().err
  assert "Krum tolerating f=9" in err and "--sweep point" not in err
  assert cli.main(T + ["--sweep", "mu=0,1"]) == 2  # the value did come from --sweep
  assert "--sweep point fedavg@mu=0: " in capsys.readouterr().err


def test_seed_and_seeds_help_say_where_the_data_comes_from():
  text = _help("run")
  assert ("--seeds SEEDS number of seeds N >= 1: runs seeds S..S+N-1 (S = --seed) on data "
          "generated once from the first seed S") in text
  assert "--seed SEED first seed S >= 0: the task's data" in text
  assert "drawn once from S" in text


def test_seeds_share_the_first_seeds_data():
  """What the help states, read from the planner: `--seeds 2` trains seeds 0 and 1 on
  data from seed 0; `--seed 1` trains seed 1 on data from seed 1."""
  from fedjax_inv.runner import experiment
  two = experiment.plan_experiment({"task": "linear_regression", "seed": 0, "seeds": 2})
  one = experiment.plan_experiment({"task": "linear_regression", "seed": 1})
  assert (two.seeds, two.split_seed, two.resplit) == ([0, 1], 0, False)
  assert (one.seeds, one.split_seed) == ([1], 1)
  assert two.task.info["seed"] == 0 and one.task.info["seed"] == 1


@pytest.mark.parametrize("sub", ["", "run", "list", "hparams", "tune", "bench"])
def test_help_has_no_insider_wording(sub):
  text = _help(*([sub] if sub else []))
  assert not INSIDER.search(text), INSIDER.search(text).group(0)


@pytest.mark.parametrize("module", ["cli.py", "runner/config.py"])
def test_messages_have_no_insider_wording(module):
  """Every string of cli.py / config.py other than a docstring (help texts, error
  messages, printed lines) is free of insider wording."""
  path = pathlib.Path(cli.__file__).parent / module
  tree = ast.parse(path.read_text())
  docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
                and n.body and isinstance(n.body[0], ast.Expr)}
  found = [(n.lineno, n.value) for n in ast.walk(tree)
           if isinstance(n, ast.Constant) and isinstance(n.value, str)
           and id(n) not in docstrings and INSIDER.search(n.value)]
  assert found == []
  for key in config.RUN_KEYS:  # the generated help, too
    assert not INSIDER.search(config.help_text(key)), key
