"""Every results table is generated, every verdict computed, one ± convention.

What must hold:
- every markdown table of README.md, docs/reproductions.md and experiments/**/*.md is
  either inside a generated block (``<!-- fair:VIEW -->`` or ``<!-- table:NAME -->``),
  regenerated here from the committed raw files and found equal, or explicitly marked
  ``<!-- static: reason -->`` as not a results table;
- a verdict follows its definition (fedjax_inv/eval/verdict.py), checked on hand-made
  numbers, and the top-level table and the per-folder tables agree row by row;
- ``outputs.mean_std`` is the sample std (ddof 1) over finite values, the one used by
  ``run`` and ``tune``, and a diverged seed is shown, never dropped silently.
"""
import math
import pathlib
import re
import sys

import numpy as np
import pytest

from fedjax_inv.runner import outputs, tuning
from fedjax_inv.eval import verdict as vd

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fair():
  sys.path.insert(0, str(ROOT / "experiments"))
  try:
    import fair as mod
  finally:
    sys.path.pop(0)
  return mod


def _tables(text: str):
  """(line number, header) of every markdown table: a ``|`` line followed by a
  ``|---|`` separator line."""
  lines = text.splitlines()
  out = []
  for i in range(len(lines) - 1):
    if (lines[i].startswith("|") and re.fullmatch(r"\|[-| :]+\|", lines[i + 1].strip())
        and (i == 0 or not lines[i - 1].startswith("|"))):
      out.append((i, lines[i]))
  return out


def _generated_spans(text: str, fair) -> list:
  spans = []
  for rx in (fair.BLOCK, fair.TABLE):
    for m in rx.finditer(text):
      spans.append((m.start(3), m.end(3)))
  return spans


def test_every_table_is_generated_or_marked_static(fair):
  bad = []
  for path in fair.readmes():
    text = path.read_text()
    spans = _generated_spans(text, fair)
    offsets = np.cumsum([0] + [len(l) + 1 for l in text.splitlines()])
    lines = text.splitlines()
    for i, head in _tables(text):
      pos = offsets[i]
      if any(a <= pos < b for a, b in spans):
        continue
      if i > 0 and re.fullmatch(r"<!-- static: .+ -->", lines[i - 1].strip()):
        continue
      bad.append(f"{path.relative_to(ROOT)}:{i + 1}: {head[:70]}")
  assert not bad, ("tables neither generated nor marked `<!-- static: reason -->` "
                   "(a results table needs a generator in experiments/<folder>/tables.py):\n"
                   + "\n".join(bad))


def test_generated_tables_equal_the_regenerated_ones(fair, capsys):
  assert fair.tables(check=True) == 0, capsys.readouterr().out


def test_a_block_naming_no_generator_fails(fair):
  with pytest.raises(KeyError, match="no generator"):
    fair.render_table("no_such_folder/x")


def test_top_level_verdicts_agree_with_every_folder(fair):
  """The top-level table is the union of the folders' tables, row by row, verdicts
  included: neither is typed by hand."""
  top = fair.verdicts_table().split("\n\n")[0].splitlines()[2:]
  rows = []
  for folder in fair.PAPERS:
    body = fair.verdicts_table(folder)
    if body == "(no claims)":
      continue
    rows += body.split("\n\n")[0].splitlines()[2:]
  strip = lambda r: r.rsplit(" | ", 1)[0] + " |"  # noqa: E731  (the folder column)
  assert [strip(r) for r in top] == rows
  assert len(top) >= 10


def _claim(ours, base, paper=0.58, paper_base=0.10, pm=0.03, point=0.01, higher=True):
  return vd.Claim(paper="P", what="w", method="M", paper_value=paper, ours=ours,
                  baseline="B", paper_baseline=paper_base, ours_baseline=base, paper_pm=pm,
                  point=point, higher=higher)


def test_verdict_definitions():
  # within the paper's ± of its number, right sign
  assert vd.verdict(_claim([0.57, 0.59, 0.56], [0.1, 0.11, 0.12])) == "reproduced"
  # 1 point (0.01) when the paper's ± is smaller
  assert vd.verdict(_claim([0.572] * 3, [0.1] * 3, pm=0.0)) == "reproduced"
  assert vd.verdict(_claim([0.572] * 3, [0.1] * 3, pm=0.0, point=0.001)) == "direction"
  # same sign, smaller gain, above the seed spread: direction (ColoredMNIST's case)
  assert vd.verdict(_claim([0.42, 0.5, 0.57], [0.24, 0.25, 0.26])) == "direction"
  # the gain is within the seed spread: no effect
  assert vd.verdict(_claim([0.30, 0.20, 0.25], [0.24, 0.25, 0.26])) == "not reproduced"
  # opposite sign
  assert vd.verdict(_claim([0.2] * 3, [0.3] * 3)) == "not reproduced"
  # the level right but the sign wrong is not a reproduction
  assert vd.verdict(_claim([0.58] * 3, [0.7] * 3)) == "not reproduced"
  # lower is better (a loss): a lower loss than the baseline is the paper's direction
  loss = dict(paper=0.54, paper_base=0.57, pm=0.0, higher=False)
  assert vd.verdict(_claim([0.55, 0.551, 0.549], [0.60, 0.601, 0.599], **loss)) == \
      "reproduced"
  assert vd.verdict(_claim([0.57, 0.571, 0.569], [0.60, 0.601, 0.599], **loss)) == \
      "direction"
  assert vd.verdict(_claim([0.62, 0.621, 0.619], [0.60, 0.601, 0.599], **loss)) == \
      "not reproduced"
  # the paper's own gap is within its ±: no effect in the paper, so only "no effect"
  # here reproduces it, at the paper's level
  flat = dict(paper=0.780, paper_base=0.781, pm=0.004)
  assert vd.verdict(_claim([0.779, 0.781, 0.780], [0.78, 0.782, 0.781], **flat)) == \
      "reproduced"
  assert vd.verdict(_claim([0.726, 0.74, 0.71], [0.764, 0.75, 0.776], **flat)) == \
      "not reproduced"
  # aggregates only (mean, std, seeds): the same rules
  agg = vd.Claim(paper="P", what="w", method="M", paper_value=96.7, ours=[],
                 ours_agg=(85.6, 0.5, 3), baseline="B", paper_baseline=94.5,
                 ours_baseline=[], ours_baseline_agg=(84.7, 0.1, 3), raw=False)
  assert vd.verdict(agg) == "direction"
  assert "B 84.7 ± 0.1 → M 85.6 ± 0.5 (3 seeds, aggregates only" in vd.table([agg])
  # no numbers of ours
  assert vd.verdict(_claim([], [0.1])) == "not run"
  assert vd.verdict(_claim([None, float("nan")], [0.1])) == "not run"
  # a level-only claim (no baseline)
  lvl = vd.Claim(paper="P", what="w", method="M", paper_value=94.5, ours=[94.0, 94.2])
  assert vd.verdict(lvl) == "reproduced"
  assert vd.verdict(vd.Claim(paper="P", what="w", method="M", paper_value=94.5,
                             ours=[92.0, 92.4])) == "not reproduced"
  with pytest.raises(ValueError, match="no paper value"):
    vd.verdict(vd.Claim(paper="P", what="w", method="M", paper_value=None, ours=[1.0]))


def test_verdict_table_shows_counts_caveats_and_aggregates():
  c = vd.Claim(paper="P", what="w", method="M", paper_value=0.58, ours=[0.5, None, 0.52],
               baseline="B", paper_baseline=0.1, ours_baseline=[0.1, 0.1, 0.1],
               point=0.01, digits=3, raw=False, note="a caveat")
  text = vd.table([c])
  assert "(2/3 finite)" in text and "aggregates only" in text and "(a caveat)" in text
  assert vd.counts([c]) == {"reproduced": 0, "direction": 1, "not reproduced": 0,
                            "not run": 0}


def test_one_mean_std_sample_std_over_finite_values():
  v = [0.2, 0.4, 0.9]
  m, s = outputs.mean_std(v)
  assert m == pytest.approx(0.5)
  assert s == pytest.approx(math.sqrt(((0.3 ** 2) + (0.1 ** 2) + (0.4 ** 2)) / 2))
  assert tuning.mean_std(v) == (m, s)  # tune's ± is run's
  assert outputs.mean_std([0.7]) == (0.7, 0.0)
  assert outputs.mean_std([0.2, None, float("inf"), 0.4, float("nan")]) == \
      pytest.approx((0.3, math.sqrt(0.02)))
  assert all(math.isnan(x) for x in outputs.mean_std([None, float("nan")]))
  assert outputs.format_mean_std([0.2, None, 0.4], 2) == "0.30 ± 0.14 (2/3 finite)"
  assert outputs.format_mean_std([None, None], 2) == "diverged (0/2 finite)"
  assert outputs.format_mean_std([0.5, 0.5], 1, scale=100) == "50.0 ± 0.0"


def test_run_table_counts_a_diverged_seed():
  runs = [{"algorithm": "a", "status": "ok", "v": 0.2},
          {"algorithm": "a", "status": "ok", "v": 0.4},
          {"algorithm": "a", "status": "diverged", "v": None},
          {"algorithm": "b", "status": "ok", "v": 0.5}]
  rows = outputs.comparison_table(runs, ["acc"], lambda r, m: r["v"])
  assert rows[0]["seeds"] == 3 and rows[0]["acc_finite"] == 2 and rows[0]["acc_n"] == 3
  assert rows[0]["acc_std"] == pytest.approx(np.std([0.2, 0.4], ddof=1))
  text = outputs.format_table(rows, ["acc"])
  assert "0.300 ± 0.141 (2/3 finite)" in text and "| b | 1 | 0.500 ± 0.000 |" in text


def test_every_task_says_where_its_starting_values_come_from():
  from fedjax_inv.tasks import make_task, task_registry
  for name, e in task_registry().items():
    if not e.builder.__module__.startswith("fedjax_inv."):
      continue  # a task another test registered
    s = e.starting
    assert any(k in s for k in ("the paper's settings", "the papers' settings",
                                "our choice", "picked on", "FedSR §", "the IRM protocol")), \
        (name, s)
    if "picked on" in s:  # a search names the data it was scored on
      assert any(k in s for k in ("OOD", "test", "training", "validation")), (name, s)
  info = make_task("linear_regression", seed=0).info
  assert info["starting_values"] == task_registry()["linear_regression"].starting


def test_results_from_before_flower_partitioners_are_labelled():
  """Raw runs of a label-skew task whose data note does not name Flower Datasets (made with
  the former partitioner) carry the caveat; runs whose notes all name it carry none."""
  from fedjax_inv import tasks
  note = tasks.make_task("mnist_noniid", n_train=200, n_test=20).info["data_note"]
  assert "Flower Datasets' DirichletPartitioner" in note
  assert tuning.partitioner_caveat([note, note]) == ""
  old = note.split(" (")[0] + " (dirichlet partition), 200 training / 20 test images"
  assert "080cef5" in tuning.partitioner_caveat([note, old])
  assert tuning.partitioner_caveat([note, None]) == tuning.FORMER_PARTITIONER
  assert tuning.partitioner_caveat([]) == tuning.FORMER_PARTITIONER
