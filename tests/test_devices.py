"""`fedjax-inv run --devices N|all` (issue 23 item 3): the client axis sharded over N of 8
virtual CPU devices gives the single-device results (float32 tolerance), checkpoints and
`--resume` included; bad values exit 2 with one line and write nothing.

Runs in a subprocess: ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set
before JAX is imported. The task (linear_regression) has 3 clients, so the sharded runs use
3 of the 8 devices (a cohort must split evenly over the devices).
"""
import json
import os
import subprocess
import sys
import textwrap

import chex
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import os, sys, json, pathlib, contextlib, io
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax
    from fedjax_inv import cli
    from fedjax_inv.runner import simulation
    tmp = pathlib.Path(sys.argv[1])
    base = ["run", "--task", "linear_regression", "--algorithm", "fedavg,scaffold",
            "--rounds", "4", "--eval-every", "2", "--no-progress"]
    res = {"device_count": jax.device_count()}

    def run(name, *extra):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = cli.main(base + ["--out", str(tmp / name), *extra])
        s = tmp / name / "summary.json"
        res[name] = {"rc": rc, "stderr": err.getvalue().strip().splitlines()[-1:],
                     "written": (tmp / name).exists(),
                     "summary": json.loads(s.read_text()) if s.is_file() else None}

    run("d1", "--devices", "1")
    run("d3", "--devices", "3")
    run("all")  # 3 clients do not split over 8 devices: unsharded
    run("d9", "--devices", "9")
    run("d2", "--devices", "2")
    run("d0", "--devices", "0")
    # interrupted after round 2 of scaffold (checkpoint every round), then --resume
    real = simulation.run
    def interrupted(*a, callback=None, **k):
        def cb(entry):
            callback(entry)
            if a[1].name == "scaffold" and entry["round"] == 2:
                raise KeyboardInterrupt
        return real(*a, callback=cb, **k)
    simulation.run = interrupted
    run("cut", "--devices", "3", "--checkpoint-every", "1")
    simulation.run = real
    rc = cli.main(["run", "--resume", str(tmp / "cut"), "--no-progress"])
    res["resumed"] = {"rc": rc, "summary": json.loads((tmp / "cut" / "summary.json")
                                                      .read_text())}
    print("RESULT" + json.dumps(res))
""")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("devices")
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp)], capture_output=True,
                        text=True, env=env, cwd=ROOT, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
  return json.loads(line[len("RESULT"):])


def _finals(summary):
  return {r["algorithm"]: r["final"] for r in summary["runs"]}


def _close(a, b):
  assert a.keys() == b.keys()
  for alg in a:
    keys = sorted(k for k, v in a[alg].items() if isinstance(v, float))
    assert keys and keys == sorted(k for k, v in b[alg].items() if isinstance(v, float))
    chex.assert_trees_all_close([np.float32(a[alg][k]) for k in keys],
                                [np.float32(b[alg][k]) for k in keys], rtol=1e-5, atol=1e-6)


@pytest.mark.multiprocess
def test_three_of_eight_devices_equal_one(result):
  assert result["device_count"] == 8
  d1, d3 = result["d1"]["summary"], result["d3"]["summary"]
  assert result["d1"]["rc"] == result["d3"]["rc"] == 0
  assert d1["jax"]["devices_used"] == 1 and d3["jax"]["devices_used"] == 3
  assert d3["config"]["devices"] == 3
  _close(_finals(d1), _finals(d3))


@pytest.mark.multiprocess
def test_all_devices_with_an_uneven_cohort_runs_unsharded(result):
  s = result["all"]["summary"]
  assert result["all"]["rc"] == 0 and s["jax"]["devices_used"] == 1
  _close(_finals(result["d1"]["summary"]), _finals(s))


@pytest.mark.multiprocess
def test_resume_on_three_devices_equals_the_uninterrupted_run(result):
  assert result["cut"]["rc"] == 130  # interrupted
  r = result["resumed"]
  assert r["rc"] == 0 and r["summary"]["status"] == "ok"
  assert r["summary"]["jax"]["devices_used"] == 3
  _close(_finals(result["d3"]["summary"]), _finals(r["summary"]))


@pytest.mark.multiprocess
@pytest.mark.parametrize("name,says", [
    ("d9", "this machine has 8 cpu device(s); use --devices all or a number <= 8"),
    ("d2", "clients_per_round=3 does not split evenly over 2 devices; use --devices 1, "
           "or a --clients-per-round that is a multiple of 2"),
    ("d0", "--devices 0: use 'all' or a number of devices >= 1")])
def test_bad_devices_exit_2_with_one_line_and_write_nothing(result, name, says):
  r = result[name]
  assert r["rc"] == 2 and not r["written"], r
  assert len(r["stderr"]) == 1 and says in r["stderr"][0], r["stderr"]


# ---- `fedjax-inv run` over two processes (--coordinator, gloo CPU collectives) ----------

CLI = ["-m", "fedjax_inv.cli", "run", "--task", "synthetic_hospital", "--algorithm",
       "fedavg,scaffold", "--rounds", "3", "--eval-every", "1", "--local-steps", "3",
       "--no-progress"]


# The CLI with checkpoint saves cut short: after saving round 2 of scaffold, every process
# raises KeyboardInterrupt (as Ctrl-C would), so `--resume` has a half-done run to continue.
CUT = textwrap.dedent("""
    import sys
    from fedjax_inv import cli
    from fedjax_inv.runner import checkpoint
    real = checkpoint.save_checkpoint
    def save(path, state, meta):
        real(path, state, meta)
        if "scaffold" in str(path) and meta["round"] == 2:
            raise KeyboardInterrupt
    checkpoint.save_checkpoint = save
    sys.exit(cli.main(sys.argv[1:]))
""")


def _cli(tmp, name, devices, extra, env_extra=None, cut=False, base=None):
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env.update(env_extra or {})
  log = open(os.path.join(tmp, name + ".log"), "w")
  argv = (CLI if base is None else base)[2:]
  prog = ["-c", CUT] if cut else ["-m", "fedjax_inv.cli"]
  return subprocess.Popen([sys.executable] + prog + argv + extra, env=env, cwd=ROOT,
                          stdout=log, stderr=subprocess.STDOUT), log


def _two_processes(tmp, out, extra=(), cut=False, base=None, tag="p"):
  from tests.test_multihost import _free_port
  coord = f"127.0.0.1:{_free_port()}"
  where = [] if out is None else ["--out", str(out)]
  procs = [_cli(tmp, f"{tag}{i}", 1, ["--coordinator", coord, "--num-processes", "2",
                                      "--process-id", str(i), *where, *extra],
                cut=cut, base=base)
           for i in (1, 0)]  # process 1 first: it waits for the coordinator
  rcs = []
  for p, log in procs:
    rcs.append(p.wait(timeout=600))
    log.close()
  return rcs


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
  from tests.test_multihost import _gloo_missing
  why = _gloo_missing()
  if why:
    pytest.skip(why)
  tmp = tmp_path_factory.mktemp("mp")
  rcs = _two_processes(tmp, tmp / "mp")
  ref, log = _cli(tmp, "ref", 2, ["--out", str(tmp / "ref")])
  ref_rc = ref.wait(timeout=600)
  log.close()
  return tmp, rcs, ref_rc


@pytest.mark.multiprocess
def test_two_processes_equal_one_process_with_two_devices(two_process_run):
  tmp, rcs, ref_rc = two_process_run
  assert rcs == [0, 0] and ref_rc == 0, (tmp / "p0.log").read_text()[-2000:]
  mp = json.loads((tmp / "mp" / "summary.json").read_text())
  ref = json.loads((tmp / "ref" / "summary.json").read_text())
  assert mp["jax"]["devices"] == ref["jax"]["devices"] == 2
  assert mp["jax"]["devices_used"] == 2  # 2 clients, one per process's device
  _close(_finals(ref), _finals(mp))
  assert _finals(mp)["fedavg"] != _finals(mp)["scaffold"]  # both algorithms really ran
  # only process 0 wrote; the other process's scratch folder is gone
  assert sorted(p.name for p in tmp.iterdir() if p.is_dir()) == ["mp", "ref"]


@pytest.mark.multiprocess
def test_two_processes_checkpoint_and_resume_equal_the_uninterrupted_run(two_process_run):
  """Both processes save every round into the shared --out; both stop after scaffold's
  round-2 checkpoint (fedavg finished); `--resume` over two processes keeps fedavg and
  continues scaffold from round 3: the finals equal the uninterrupted two-process run."""
  tmp, rcs, _ = two_process_run
  assert rcs == [0, 0]
  out = tmp / "cut"
  cut = _two_processes(tmp, out, ["--checkpoint-every", "1"], cut=True, tag="cut")
  assert cut == [130, 130], (tmp / "cut0.log").read_text()[-2000:]
  assert (out / "fedavg" / "seed0" / "summary.json").is_file()
  ck = out / "scaffold" / "seed0" / "checkpoint"
  assert sorted(p.name for p in ck.iterdir() if p.name.isdigit()) == ["2"]
  rcs = _two_processes(tmp, None, ["--resume", str(out), "--no-progress"], base=CLI[:3],
                       tag="res")
  assert rcs == [0, 0], (tmp / "res0.log").read_text()[-2000:]
  log = (tmp / "res0.log").read_text()
  assert "fedavg" in log and "finished earlier (resumed), kept" in log
  resumed = json.loads((out / "summary.json").read_text())
  ref = json.loads((tmp / "mp" / "summary.json").read_text())
  assert resumed["status"] == "ok"
  _close(_finals(ref), _finals(resumed))
  rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  assert sorted(r["round"] for r in rows if r["algorithm"] == "scaffold") == [1, 2, 3]
  assert not ck.exists()  # removed by process 0 when the run ended


@pytest.mark.multiprocess
def test_two_processes_refuse_checkpoints_without_out_with_one_line(tmp_path):
  from tests.test_multihost import _gloo_missing
  if _gloo_missing():
    pytest.skip(_gloo_missing())
  rcs = _two_processes(tmp_path, None, ["--checkpoint-every", "1"])
  assert rcs == [2, 2]
  last = (tmp_path / "p0.log").read_text().strip().splitlines()[-1]
  assert "--checkpoint-every over 2 processes needs --out FOLDER" in last
  assert not [p for p in tmp_path.iterdir() if p.is_dir()]


@pytest.mark.multiprocess
@pytest.mark.parametrize("extra,says", [
    (["--process-id", "2"], "--process-id 2: must be in 0..1 for --num-processes 2"),
    (["--process-id", "1"], "not reachable within 2 s"),
    (["--process-id", "x"], "--process-id 'x': a run over several processes needs")])
def test_bad_process_flags_exit_2_with_one_line_and_write_nothing(tmp_path, extra, says):
  from tests.test_multihost import _free_port
  p, log = _cli(tmp_path, "bad", 1, ["--coordinator", f"127.0.0.1:{_free_port()}",
                                     "--num-processes", "2", *extra, "--out",
                                     str(tmp_path / "o")], {"FEDJAX_INV_DIST_TIMEOUT": "2"})
  assert p.wait(timeout=120) == 2
  log.close()
  lines = (tmp_path / "bad.log").read_text().strip().splitlines()
  assert len(lines) == 1 and says in lines[0], lines
  assert not (tmp_path / "o").exists()
