"""Rewrites tests/slow_tests.txt from a measured full run, so the fast tier stays fast.

    .venv/bin/python -m pytest -q -n 2 --dist loadgroup --junitxml=/tmp/full.xml
    .venv/bin/python tests/tiers.py /tmp/full.xml

Every test that is not already ``slow`` or ``multiprocess`` by its own marker and took at
least ``SLOW_S`` seconds (setup + call, from the JUnit XML) is listed; ``tests/conftest.py``
marks the listed tests ``slow``. The list is sorted and says when and how it was measured.
A test that no longer exists is dropped from the list (it would never match anyway).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
LIST = HERE / "slow_tests.txt"
SLOW_S = 4.0


def nodeid(case: ET.Element) -> str:
  """``tests/test_x.py::test_y[param]`` of a JUnit ``testcase`` (``classname`` is the
  dotted module path, with a test class appended when there is one)."""
  parts = case.get("classname", "").split(".")
  for i in range(len(parts), 0, -1):
    path = "/".join(parts[:i]) + ".py"
    if (ROOT / path).is_file():
      return "::".join([path, *parts[i:], case.get("name", "")])
  raise ValueError(f"no test file for classname {case.get('classname')!r}")


def durations(xml_path: pathlib.Path) -> dict[str, float]:
  """{node id: seconds} of every test case in the JUnit XML."""
  out = collections.Counter()
  for case in ET.parse(xml_path).getroot().iter("testcase"):
    out[nodeid(case)] += float(case.get("time", 0.0))
  return dict(out)


def marked_elsewhere() -> set[str]:
  """The node ids that are ``slow`` or ``multiprocess`` without the list."""
  r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                      "-p", "no:cacheprovider", "-m", "slow or multiprocess"],
                     capture_output=True, text=True, cwd=ROOT,
                     env={**os.environ, "FEDJAX_INV_IGNORE_SLOW_LIST": "1"})
  return {l for l in r.stdout.splitlines() if "::" in l}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("junit_xml", type=pathlib.Path)
  ap.add_argument("--machine", default="the 2-core CPU", help="where it was measured")
  args = ap.parse_args(argv)
  times = durations(args.junit_xml)
  already = marked_elsewhere()
  slow = sorted(k for k, v in times.items() if v >= SLOW_S and k not in already)
  head = [f"# Tests measured at >= {SLOW_S:g} s (setup + call) in a full run with "
          f"`pytest -n 2 --dist loadgroup` on {args.machine},",
          f"# {datetime.date.today().isoformat()}; tests/conftest.py marks them `slow`. "
          "Regenerate: python tests/tiers.py JUNIT_XML"]
  LIST.write_text("\n".join(head + slow) + "\n")
  print(f"{LIST.relative_to(ROOT)}: {len(slow)} tests, "
        f"{sum(times[k] for k in slow):.0f} s of the fast tier's "
        f"{sum(v for k, v in times.items() if k not in already):.0f} s moved to slow")
  return 0


if __name__ == "__main__":
  sys.exit(main())
