"""tests/slow_tests.txt (the measured slow tests that tests/conftest.py marks ``slow``)
names tests that exist, each once, and tests/tiers.py reads pytest's JUnit XML into the
same node ids pytest prints."""
import pathlib
import re
import xml.etree.ElementTree as ET

from tests import tiers

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_listed_test_exists_once():
  ids = [l.strip() for l in (ROOT / "tests" / "slow_tests.txt").read_text().splitlines()
         if l.strip() and not l.startswith("#")]
  assert len(ids) == len(set(ids))
  for i in ids:
    path, name = i.split("::")[0], re.split(r"[\[:]", i.split("::")[-1])[0]
    assert (ROOT / path).is_file(), i
    assert re.search(rf"^\s*def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), i


def test_junit_case_to_node_id():
  case = ET.fromstring('<testcase classname="tests.test_tiers" '
                       'name="test_junit_case_to_node_id[a-b]" time="1.5"/>')
  assert tiers.nodeid(case) == "tests/test_tiers.py::test_junit_case_to_node_id[a-b]"
