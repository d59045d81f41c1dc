"""Every code block of README.md and the guides in docs/ is run by the suite, or says why not.

A fenced block is one of:

* ```` ```python ````: executed as written (slow tier), after a syntax check (fast tier);
  where a page claims an effect, :data:`PY_CLAIMS` checks it on the output;
* ```` ```bash ````: one ``fedjax-inv`` command per line (``\\`` continues a line).
  The fast tier parses and plans each command (every check the CLI makes before it
  compiles: flags, names, hyperparameters, the task's data); the slow tier runs it with
  fewer rounds and one seed (:func:`shrink`), and :data:`CMD_CLAIMS` checks the effects
  the text around it claims (FedProx's mu changes the result);
* ```` ```yaml ````: an experiment spec (``fedjax-inv experiment``), parsed and every
  run's configuration checked (``fedjax_inv.runner.spec``);
* ```` ```text ````: a figure, a tree or program output, not code;
* any block after ``<!-- not run: REASON -->``, which must give the reason, or after
  ``<!-- example: NAME -->``, which a test elsewhere runs by that name.

The README's first block (the two commands) is CI's own: ``.ci/run`` runs its test
command, and ``tests/test_readme.py`` checks its shape.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pathlib
import re
import shlex

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# docs/api/*.md hold only mkdocstrings directives (`::: module`), no code blocks.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<ind>[ \t]*)```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^(?P=ind)```[ \t]*$",
                   re.S | re.M)
MARK = re.compile(r"<!-- (not run|example): *(.*?) *-->\s*$")
LANGS = {"python", "bash", "text", "yaml"}


@dataclasses.dataclass(frozen=True)
class Block:
  page: str    # path relative to the repository root
  line: int    # 1-based line of the opening fence
  lang: str
  code: str    # dedented
  mark: str    # '', 'not run' or 'example'
  reason: str  # the mark's text

  @property
  def id(self) -> str:
    return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
  out = []
  for path in PAGES:
    text = path.read_text()
    for m in FENCE.finditer(text):
      before = text[:m.start()].rstrip("\n").splitlines()
      prev = before[-1].strip() if before else ""
      mk = MARK.search(prev)
      ind = len(m["ind"])
      code = "".join(l[ind:] if l[:ind].isspace() else l
                     for l in m["body"].splitlines(True))
      out.append(Block(str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1,
                       m["lang"], code, mk[1] if mk else "", mk[2] if mk else ""))
  return out


BLOCKS = blocks()
CI_BLOCK = next(b for b in BLOCKS if b.page == "README.md" and b.lang == "bash")


def commands(block: Block) -> list[list[str]]:
  """A bash block's commands as argv lists (comments dropped, ``\\`` lines joined)."""
  text = block.code.replace("\\\n", " ")
  return [argv for line in text.splitlines() if (argv := shlex.split(line, comments=True))]


RUN_BLOCKS = [b for b in BLOCKS if not b.mark and b is not CI_BLOCK]
# Each command once: the guides repeat some of the README's.
CMDS = []
for _b in RUN_BLOCKS:
  for _argv in commands(_b) if _b.lang == "bash" else ():
    if all(_argv != a for _, a in CMDS):
      CMDS.append((_b, _argv))
PY = [b for b in RUN_BLOCKS if b.lang == "python"]


def _cmd_id(item) -> str:
  b, argv = item
  return f"{b.id}:{' '.join(argv[1:4])}"


def test_every_block_says_what_it_is():
  bad = [f"{b.id}: ```{b.lang or '(no language)'}" for b in BLOCKS if b.lang not in LANGS]
  assert not bad, ("give each block a language (python, bash, yaml for a spec, or text "
                   f"for a figure or output): {bad}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "yaml"],
                         ids=lambda b: b.id)
def test_yaml_block_is_a_valid_spec(block):
  import yaml
  from fedjax_inv.runner import spec
  sp = spec.parse_spec(yaml.safe_load(block.code))
  spec.check_runs(sp.runs)
  assert sp.runs


def test_blocks_that_are_not_run_say_why():
  tests = "".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
  for b in BLOCKS:
    if b.mark == "not run":
      assert len(b.reason) > 10, f"{b.id}: 'not run' needs its reason"
    if b.mark == "example":  # a test elsewhere runs it by name
      assert f"<!-- example: {b.reason} -->" in tests, f"{b.id}: no test runs '{b.reason}'"


def test_bash_blocks_hold_only_fedjax_inv_commands():
  bad = [f"{b.id}: {' '.join(a)}" for b, a in CMDS if a[0] != "fedjax-inv"]
  assert not bad, f"run these in a test, or mark the block '<!-- not run: why -->': {bad}"
  assert len(CMDS) >= 10  # the guides' examples are found at all


@pytest.mark.parametrize("block", PY, ids=lambda b: b.id)
def test_python_block_compiles(block):
  compile(block.code, block.id, "exec")


# ------------------------------------------------------------------------ running them

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """``D`` of the guides' commands: tiny FEMNIST and Shakespeare files in TFF's layout."""
  from fedjax_inv.data import federated_files as ff
  from fedjax_inv.data import federated_synthetic as syn
  d = tmp_path_factory.mktemp("D")
  rng = np.random.default_rng(0)
  for split, n in (("train", 6), ("test", 3)):
    ff.write_tff_emnist(d / f"fed_emnist_{split}.h5", {
        f"w{i}": (rng.random((5, 28, 28), dtype=np.float32), rng.integers(0, 62, 5))
        for i in range(n)})
    sp = syn.shakespeare(3, seed=0, max_chars=300)[split]
    ff.write_tff_shakespeare(d / f"shakespeare_{split}.h5", {c: v[:3] for c, v in sp.items()})
  return d


def shrink(argv: list[str], out: pathlib.Path, data: pathlib.Path) -> list[str]:
  """The command at CI size: 2 rounds, 1 seed, its own ``--out``, ``D`` = the fixture
  files, 30 synthetic FEMNIST writers instead of 3,400, one held-out domain instead of
  ``--holdout all`` (leave-one-domain-out over every domain: tests/test_lodo.py), at most
  4 local steps where the command sets more, 2 trials for ``tune``; an ``experiment``
  (hundreds of runs) is checked and listed with ``--dry-run``, never trained here."""
  argv = [str(data) if a == "D" else a for a in argv[1:]]
  argv = ["0" if a == "all" and i and argv[i - 1] == "--holdout" else a
          for i, a in enumerate(argv)]
  if argv[0] == "run":
    argv += ["--rounds", "2", "--seeds", "1", "--out", str(out), "--no-progress"]
    if "--local-steps" in argv and int(argv[argv.index("--local-steps") + 1]) > 4:
      argv += ["--local-steps", "4"]
    if "femnist" in argv and "synthetic" in argv:
      argv += ["--task-arg", "num_clients=30"]
  elif argv[0] == "tune":
    argv += ["--trials", "2", "--rounds", "2", "--seeds", "0", "--out", str(out)]
  elif argv[0] == "experiment":
    argv += ["--dry-run"]
  return argv


def _finals(out: pathlib.Path) -> dict:
  """{algorithm: final metrics} of a one-seed ``fedjax-inv run`` folder."""
  runs = json.loads((out / "summary.json").read_text()).get("runs")
  return {r["algorithm"]: r["final"] for r in runs}


def _fedprox_differs(out):
  f = _finals(out)
  assert f["fedprox"]["train_loss"] != f["fedavg"]["train_loss"], (
      "the FedProx example must show mu's effect: same loss as FedAvg")


# (a substring of the command, the check of its output folder)
CMD_CLAIMS = [("--algorithm fedavg,fedprox --hp fedprox.mu=0.1", _fedprox_differs)]


def test_fast_validation_covers_every_claim():
  for needle, _ in CMD_CLAIMS:
    assert any(needle in " ".join(a) for _, a in CMDS), f"no example says {needle!r}"


@pytest.mark.parametrize("item", CMDS, ids=_cmd_id)
def test_command_is_valid(item, data_dir, tmp_path, monkeypatch, capsys):
  """Every check `fedjax-inv` makes before it compiles: the flags, the names, the
  hyperparameters and the task's data (planned, not trained)."""
  from fedjax_inv import cli
  from fedjax_inv.runner import experiment, tuning
  _, argv = item
  planned = []

  def plan_only(cfg, overrides=None, **_):
    planned.append(experiment.plan_experiment(cfg, overrides))
    return {}

  monkeypatch.setattr(experiment, "run_experiment", plan_only)
  monkeypatch.setattr(tuning, "tune_row", lambda *a, **k: planned.append(k) or {})
  args = shrink(argv, tmp_path / "out", data_dir)
  if args[0] == "tune":  # its table printing needs a real row: check up to the tuning
    monkeypatch.setattr(cli, "cmd_tune", _checked(cli.cmd_tune, planned))
  rc = cli.main(args)
  assert rc == 0, capsys.readouterr().err
  if args[0] in ("run", "tune"):
    assert planned


def _checked(cmd, planned):
  def wrapper(args):
    try:
      cmd(args)
    except Exception:  # noqa: BLE001 - after tune_row: the stub has no results to print
      if not planned:
        raise
    return 0
  return wrapper


@pytest.mark.slow
@pytest.mark.parametrize("item", CMDS, ids=_cmd_id)
def test_command_runs(item, data_dir, tmp_path, capsys):
  from fedjax_inv import cli
  _, argv = item
  out = tmp_path / "out"
  rc = cli.main(shrink(argv, out, data_dir))
  assert rc == 0, capsys.readouterr().err
  for needle, check in CMD_CLAIMS:
    if needle in " ".join(argv):
      check(out)


def _inv_fedavg_beats_fedavg(printed: str):
  ood = dict(re.findall(r"^(\w+) ([0-9.]+)$", printed, re.M))
  assert float(ood["inv_fedavg"]) > float(ood["fedavg"]) + 0.1, printed


# (page, the check of what the block printed)
PY_CLAIMS = {"docs/index.md": _inv_fedavg_beats_fedavg}


@pytest.mark.slow
@pytest.mark.parametrize("block", PY, ids=lambda b: b.id)
def test_python_block_runs(block):
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    exec(compile(block.code, block.id, "exec"), {"__name__": "doc_example"})
  if block.page in PY_CLAIMS:
    PY_CLAIMS[block.page](buf.getvalue())
