"""The loop across two processes (jax.distributed on 127.0.0.1): process 0 does the host-side work
and every training job whose runs split over both processes' devices spans them (iteration 1's
2 runs); one that does not (pretraining's 1, the final job's 3) is trained by process 0 alone. Tiny: one
iteration, no bootstrap."""

import json
import socket
import subprocess
import sys
import tomllib

from design.test_loop import TINY as LOOP_TINY

# test_loop's tiny config, one iteration of 2 runs (they split over the 2 devices; pretraining's 1 and the
# final job's 3 do not), no bootstrap. Everything else as test_loop's, so the final job loads test_loop's
# compiled programs from the shared cache (json.dumps writes TOML's true and 5.0 for these scalars; a string
# replace of "n = 3" once also turned "hidden = 32" into 22, and every program missed).
CHANGES = {"iterations": 1, "n": 2, "bootstrap_races": 0}
TINY = "".join(f"{k} = {json.dumps(CHANGES.get(k, v))}\n" for k, v in tomllib.loads(LOOP_TINY).items())


def test_two_processes_run_the_loop_and_share_its_training_jobs(tmp_path, loop_env):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    env = {**loop_env, "JAXRACE_COORDINATOR": f"127.0.0.1:{port}", "JAXRACE_NUM_PROCESSES": "2"}
    procs = [subprocess.Popen([sys.executable, "-m", "jaxrace.cli", "design", "--config", str(config), "--run-dir",
                               str(run), "--quiet"], env={**env, "JAXRACE_PROCESS_ID": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert outs[0][0].strip().endswith(f"report: {run / 'report.html'}")
    assert "report:" not in outs[1][0] and "jaxrace design:" not in outs[1][0]  # process 1 trains, says nothing
    stages = json.loads((run / "stages.json").read_text())
    assert "iter1/train" in stages and "final/train" in stages and "report" in stages
    # pretraining's one run is process 0's; both processes' iteration 1 starts from its agent
    for stage, runs, epochs, writers in (("pretrain", 1, 10, {"ocdbt.process_0"}),
                                         ("iter1", 2, 20, {"ocdbt.process_0", "ocdbt.process_1"}),
                                         ("final", 3, 20, {"ocdbt.process_0"})):
        curves = json.loads((run / stage / "train" / "curves.json").read_text())
        assert len(curves["runs"]) == runs and len(curves["progress"][0]) == epochs
        assert not any(r["failed"] for r in curves["runs"])
        # the processes that trained the job wrote their shards of the agents' checkpoint
        saved = run / stage / "train" / "agents" / str(epochs) / "default"
        assert {p.name for p in saved.iterdir() if p.name.startswith("ocdbt.process_")} == writers
        assert not (run / stage / "train" / "job.ckpt").exists()
    log = (run / "log.txt").read_text()
    assert "final/train: 3 runs do not split over the 2 devices of 2 processes: trained by process 0 alone" in log
    assert "iter1/train: 2 runs do not split" not in log
    assert "iter1/train: from the agents pretrained on progress (its runs [0, 0]" in log
    assert (run / "report.html").stat().st_size > 10_000
