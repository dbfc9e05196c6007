"""Training across devices and processes, and orbax checkpoints that outlive a kill and a change of devices.

Each multi-device job runs in processes of its own (distributed_job.py): a process's CPU
device count is fixed when JAX starts, and jax.distributed joins whole processes.
"""

import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from agents.test_trainer import small_trainer

from jaxrace.agents import train_many
from jaxrace.agents.checkpoint import load_checkpoint, save_checkpoint

JOB = Path(__file__).with_name("distributed_job.py")
TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(out: Path, *args: str, devices: int = 1, processes: int = 1, killed: bool = False) -> dict:
    """Runs the job in `processes` processes of `devices` CPU devices each.

    Returns process 0's results, or {"output": its output} when it was to be SIGKILLed.
    """
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(JOB), str(out), "--devices", str(devices), "--processes",
                               str(processes), "--process-id", str(i), "--port", port, *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(processes)]
    outputs = []
    for proc in procs:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == (-9 if killed else 0), output[-3000:]
        outputs.append(output)
    return {"output": outputs[0]} if killed else dict(np.load(out))


def actor_leaves(result: dict) -> list[np.ndarray]:
    return [result[f"actor_{i}"] for i in range(sum(k.startswith("actor_") for k in result))]


@pytest.fixture(scope="module")
def trainer():
    return small_trainer()


@pytest.fixture(scope="module")
def one_device(trainer):
    """The job in this process, on its one device, uninterrupted: what every other layout must reproduce."""
    state, metrics, _ = train_many(trainer, jax.random.key(0), [0], seeds_per_reward=2, chunk_epochs=1)
    return state, metrics


@pytest.fixture(scope="module")
def resumed(trainer, tmp_path_factory):
    """The job on two devices of one process, SIGKILLed after epoch 2, then finished here on one device."""
    folder = tmp_path_factory.mktemp("resumed")
    ckpt = folder / "ckpt"
    killed = run_job(folder / "out.npz", "--checkpoint", str(ckpt), "--kill-at", "2", devices=2, killed=True)
    steps = [p.name for p in ckpt.iterdir() if p.name.isdigit()]
    epochs = []
    state, metrics, _ = train_many(trainer, jax.random.key(0), [0], seeds_per_reward=2, chunk_epochs=1,
                                   checkpoint=str(ckpt), progress=lambda epoch, m: epochs.append(epoch))
    return {"output": killed["output"], "steps_at_kill": steps, "epochs": epochs, "metrics": metrics}


def test_a_job_killed_on_two_devices_resumes_on_one(resumed, one_device):
    assert "devices 2" in resumed["output"]
    assert resumed["steps_at_kill"] == ["2"]  # an epoch is reported once its checkpoint is on disk
    assert resumed["epochs"] == [3, 4]  # the finished epochs were not trained again
    metrics = resumed["metrics"]
    # epochs 1-2 sharded over two devices, 3-4 on one: the same losses as one device throughout
    np.testing.assert_allclose(metrics.critic_loss, one_device[1].critic_loss, rtol=1e-4)
    np.testing.assert_allclose(metrics.progress, one_device[1].progress, rtol=1e-5)


def test_two_processes_train_as_one_process_with_two_devices(resumed, one_device, tmp_path):
    both = run_job(tmp_path / "out.npz", "--checkpoint", str(tmp_path / "ckpt"), processes=2)
    assert int(both["processes"]) == 2 and int(both["devices"]) == 2
    assert both["trained"].tolist() == [1, 2, 3, 4]
    # epochs 1-2 against the same epochs of one process with two devices (kept in its checkpoint)
    two_devices = resumed["metrics"]
    np.testing.assert_allclose(both["critic_loss"][:, :2], two_devices.critic_loss[:, :2], rtol=1e-5)
    np.testing.assert_allclose(both["progress"][:, :2], two_devices.progress[:, :2], rtol=1e-5)
    np.testing.assert_allclose(both["critic_loss"], one_device[1].critic_loss, rtol=1e-4)
    for a, b in zip(actor_leaves(both), jax.tree.leaves(one_device[0].actor), strict=True):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-3, atol=1e-5)
    # each process wrote its own shards of the checkpoint
    saved = tmp_path / "ckpt" / "4" / "default"
    assert (saved / "ocdbt.process_0").is_dir() and (saved / "ocdbt.process_1").is_dir()


def test_runs_one_after_another_on_two_devices_train_as_vmapped_runs_on_one(trainer, tmp_path):
    """TrainConfig.sequential_runs (with host_updates, as the pixel actor on CPU) and 4 runs split over
    two devices: each device loops over its own two (shard_map), every program compiles once (`finish`
    twice: without losses in the warm-up epoch, then with; `collect` compiled twice while the initial
    state's replay was replicated), and the runs train as the vmapped job of 4 runs on one device does."""
    looped = run_job(tmp_path / "out.npz", "--sequential", "--seeds", "4", devices=2)
    assert int(looped["devices"]) == 2 and bool(looped["shard_map"])
    assert looped["loops"].tolist() == [2] * 5
    assert looped["compiles"].tolist() == [1, 1, 1, 1, 1, 2]  # init, collect, label, store, update, finish
    state, metrics, _ = train_many(trainer, jax.random.key(0), [0], seeds_per_reward=4, chunk_epochs=1)
    assert not np.allclose(metrics.progress[0], metrics.progress[2])  # the second device's runs are others
    np.testing.assert_allclose(looped["critic_loss"], metrics.critic_loss, rtol=1e-4)
    np.testing.assert_allclose(looped["progress"], metrics.progress, rtol=1e-5)
    for a, b in zip(actor_leaves(looped), jax.tree.leaves(state.actor), strict=True):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-3, atol=1e-5)


def test_a_save_torn_by_a_kill_is_ignored_and_removed(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt", {"a": np.arange(3.0, dtype=np.float32)}, 2)
    torn = ckpt / "4.orbax-checkpoint-tmp-1700000000"
    (torn / "default").mkdir(parents=True)
    (torn / "default" / "half-written").write_bytes(b"\0" * 10)
    state, step = load_checkpoint(ckpt, {"a": jax.ShapeDtypeStruct((3,), np.float32)})
    assert step == 2 and np.asarray(state["a"]).tolist() == [0.0, 1.0, 2.0]
    save_checkpoint(ckpt, {"a": np.ones(3, np.float32)}, 3)  # orbax removes torn steps before a save ends
    assert not torn.exists() and [p.name for p in ckpt.iterdir()] == ["3"]
    save_checkpoint(ckpt, {"a": np.zeros(3, np.float32)}, 3)  # a step saved again is replaced
    assert np.asarray(load_checkpoint(ckpt, {"a": jax.ShapeDtypeStruct((3,), np.float32)})[0]["a"]).sum() == 0
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        load_checkpoint(tmp_path / "missing", {"a": jax.ShapeDtypeStruct((3,), np.float32)})
