"""The batched QR-SAC trainer: vmapped runs, failure isolation, learning on a tiny task."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pins import digest, pin

import jaxrace
from jaxrace.agents import HParams, TrainConfig, make_train, runner, train_many
from jaxrace.agents.runner import committed
from jaxrace.envs import per_env_params
from jaxrace.jit import jit
from jaxrace.rewards import RewardBank, compile_reward, library_reward

# Within the compiler's magnitude limit at its default weight; a run given scale 1e9 diverges.
EXPLODING = '''
PARAMS = {"scale": 1.0}


def reward(prev, action, curr, params):
    progress = curr.progress - prev.progress
    return params["scale"] * progress, {"progress": progress}
'''
EXPLODE = HParams(reward_params=jnp.asarray([[0.0], [1e9]], jnp.float32))


def small_setup():
    env, params = jaxrace.make(track="oval", start="time_trial", time_limit=60.0)
    bank = RewardBank.from_compiled([library_reward("progress"), compile_reward(EXPLODING, name="exploding")])
    return env, params, bank


def small_trainer(setup=None, **options):
    """options: more TrainConfig fields (`sequential_runs`, `host_updates`)."""
    env, params, bank = setup or small_setup()
    config = TrainConfig(num_envs=4, rollout_steps=4, updates_per_epoch=2, batch_size=16, replay_size=2000,
                         warmup_epochs=1, epochs=4, **options)
    return make_train(config, env, params, bank)


@pytest.fixture(scope="module")
def setup():
    return small_setup()


@pytest.fixture(scope="module")
def trainer(setup):
    """One small trainer for every test: train_many compiles it once per (runs, chunk) shape.

    Every test below runs 2 runs in chunks of 2 epochs, so they share one compiled job
    (test_distributed builds the same trainer in processes with other devices).
    """
    return small_trainer(setup)


def test_vmapped_runs_differ_by_seed_and_match_the_unvmapped_run(trainer):
    """train_many's split programs (collect, label, learn) against one fused, unvmapped run."""
    key = jax.random.key(0)
    states, metrics, _ = train_many(trainer, key, [0], seeds_per_reward=2, chunk_epochs=2)
    assert metrics.critic_loss.shape == (2, 4)
    assert not np.allclose(metrics.progress[0], metrics.progress[1])
    keys = jax.random.split(key, 2)
    single_state, single = jax.jit(lambda k: trainer.train(k, HParams(), 0))(keys[1])
    np.testing.assert_allclose(metrics.critic_loss[1], single.critic_loss, rtol=1e-4)
    np.testing.assert_allclose(metrics.progress[1], single.progress, rtol=1e-5)
    leaves = jax.tree.leaves(jax.tree.map(lambda a, b: np.allclose(a[1], b, rtol=1e-3, atol=1e-5),
                                          states.actor, single_state.actor))
    assert all(leaves)


def test_sequential_runs_train_the_runs_the_vmapped_job_trains(setup, trainer):
    """TrainConfig(sequential_runs=True): each program loops over the runs (lax.map) instead of
    vmapping them, and trains the same runs to rounding (test_distributed: on two devices)."""
    env, params, bank = setup
    vmapped, v_metrics, _ = train_many(trainer, jax.random.key(1), [0, 0], chunk_epochs=2)  # the pinned job
    sequential = make_train(dataclasses.replace(trainer.config, sequential_runs=True), env, params, bank)
    looped, l_metrics, _ = train_many(sequential, jax.random.key(1), [0, 0], chunk_epochs=2)
    for a, b in zip(jax.tree.leaves((vmapped.actor, vmapped.critic, v_metrics)),
                    jax.tree.leaves((looped.actor, looped.critic, l_metrics)), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    assert not np.allclose(v_metrics.progress[0], v_metrics.progress[1])  # two different runs, not one twice


def test_a_loop_of_chunks_from_a_committed_init_state_compiles_once(trainer):
    """train_reference's loop: the jitted init's state is uncommitted, a chunk's output is
    committed, and jit compiles the two apart; `committed` makes the first call the later ones'."""
    hparams = HParams()
    chunk = jit(lambda s: trainer.run_epochs(s, hparams, 0, 1))  # as train_reference: jaxrace's options
    init = jit(trainer.init)
    state = committed(init(jax.random.key(3), hparams, 0))
    for _ in range(2):
        state = chunk(state)[0]
    assert chunk._cache_size() == 1
    chunk(init(jax.random.key(3), hparams, 0))
    assert chunk._cache_size() == 2  # the hazard: the bare state compiles a program of its own


def test_a_curriculum_hands_the_state_to_a_learner_in_traffic_and_restarts_every_env():
    """train_reference's --alone-first: a state trained with every env alone goes on under a learner
    whose envs are half in traffic; the restart keeps networks, replay and key and resets the envs."""
    env, params = jaxrace.make(track="oval", start="random", time_limit=60.0)
    bank = RewardBank.from_compiled([library_reward("progress")])
    config = TrainConfig(num_envs=4, rollout_steps=4, updates_per_epoch=2, batch_size=16, replay_size=2000,
                         warmup_epochs=1, epochs=2)
    alone = make_train(config, env, per_env_params(params, 4, num_active_opponents=[0] * 4), bank)
    traffic = make_train(config, env, per_env_params(params, 4, num_active_opponents=[0, 0, 7, 7]), bank)
    hparams = HParams()
    state, _ = jax.jit(lambda k: alone.run_epochs(alone.init(k, hparams, 0), hparams, 0, 2))(jax.random.key(0))
    assert not np.asarray(state.env_state.active[:, 1:]).any()

    restarted = jax.jit(traffic.restart_envs)(state, jax.random.key(1))
    for name in ("actor", "critic", "target_critic", "log_alpha", "replay", "epoch"):
        for a, b in zip(jax.tree.leaves(getattr(restarted, name)), jax.tree.leaves(getattr(state, name)), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_array_equal(jax.random.key_data(restarted.key), jax.random.key_data(state.key))
    assert np.asarray(restarted.reset).all()
    active = np.asarray(restarted.env_state.active)
    assert active[:, 0].all() and not active[:2, 1:].any() and active[2:, 1:].all()
    assert np.all(np.asarray(restarted.env_state.steps) == 0)

    later, metrics = jax.jit(lambda s: traffic.run_epochs(s, hparams, 0, 2))(restarted)
    assert int(later.epoch) == 4 and not bool(later.failed)
    assert np.isfinite(np.asarray(metrics.critic_loss)).all() and (np.asarray(metrics.critic_loss) > 0).all()
    assert np.asarray(later.env_state.active[2:, 1:]).all()  # the traffic envs stay in traffic


def test_host_updates_train_as_the_scan_of_updates_does(setup, trainer):
    """TrainConfig.host_updates: each update its own jitted call from the host; the same training."""
    env, params, bank = setup
    host = make_train(dataclasses.replace(trainer.config, host_updates=True), env, params, bank)
    key = jax.random.key(0)
    scanned, m_scan, _ = train_many(trainer, key, [0], seeds_per_reward=2, chunk_epochs=2)
    looped, m_host, _ = train_many(host, key, [0], seeds_per_reward=2, chunk_epochs=2)
    assert np.all(np.asarray(m_host.critic_loss[:, 0]) == 0.0)  # the warm-up epoch: no updates
    assert np.all(np.asarray(m_host.critic_loss[:, 1:]) > 0.0)
    for name in ("critic_loss", "actor_loss", "progress", "reward", "alpha"):
        np.testing.assert_allclose(getattr(m_host, name), getattr(m_scan, name), rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(looped.epoch, [4, 4])
    np.testing.assert_array_equal(jax.random.key_data(looped.key), jax.random.key_data(scanned.key))
    for a, b in zip(jax.tree.leaves(looped.actor), jax.tree.leaves(scanned.actor), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    with pytest.raises(ValueError, match="split programs"):
        train_many(host, key, [0], fused=True)


def test_a_failing_candidate_is_frozen_and_does_not_touch_the_others(trainer):
    key = jax.random.key(1)
    with_bad, m_bad, _ = train_many(trainer, key, [0, 1], hparams=EXPLODE, chunk_epochs=2)
    without, m_good, _ = train_many(trainer, key, [0, 0], chunk_epochs=2)
    assert bool(m_bad.failed[1, -1]) and not bool(m_bad.failed[0, -1])
    # Run 0 is bit-for-bit what it is when the other run is healthy.
    for a, b in zip(jax.tree.leaves(with_bad.actor), jax.tree.leaves(without.actor), strict=True):
        np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(m_bad.critic_loss[0], m_good.critic_loss[0])
    # The failed run's networks stopped changing once it failed.
    first_failed = int(np.argmax(np.asarray(m_bad.failed[1])))
    assert first_failed >= 1  # warm-up epochs do no updates, so failure comes with the first update
    assert all(np.all(np.isfinite(np.asarray(x[1]))) for x in jax.tree.leaves(with_bad.actor))


# Re-pinned when jaxrace's programs began to compile with their own options on a CPU (`jaxrace.jit`),
# and again when those kept YNNPACK out (2026-12-01; with the first two options alone the avx2 pin was
# ed228fd2da523d4a4b18fd93); with XLA's defaults (JAXRACE_XLA_DEFAULTS=1) the chunk still gives the
# earlier pins bit for bit (avx512 692e124595eb39d1a75cc93a, avx2 72272d4b60016cddf555caa8; checked on
# avx2, 2026-12-01). The options are the program's own, so the tests' XLA_FLAGS do not change these
# bits (the zen4 pin, recorded on a 2-core AMD EPYC of the Zen 4 generation, 2026-12-03, came out the
# same from this test and from the script). Other AVX-512 classes ("avx512", "avx512vbmi", "zen5") skip
# until recorded there: `PYTHONPATH=tests python tests/agents/test_trainer.py` prints it.
TRAINING_DIGEST = {"avx2": "a94c481171669010b172d7ca", "zen4": "1a7c6af4c81747e9888a6734"}


def training_digest(trainer) -> str:
    state, metrics, _ = train_many(trainer, jax.random.key(1), [0, 0], chunk_epochs=2)
    return digest((state.actor, state.critic, state.log_alpha, metrics))


def test_a_short_training_chunk_is_bit_identical_to_the_pinned_one(trainer):
    """Pinned when replay began to store rewards (train_many's split programs); a refactor must not change it.

    (The fused program gave the earlier pin bit for bit at that change; it matches these
    runs to rounding, see the vmapped-runs test.) The job is the one the other tests share.
    """
    want = pin(TRAINING_DIGEST, "training")
    got = training_digest(trainer)
    assert got == want, f"training digest {got} != pinned {want}"


@jax.jit
def first_run(state):
    """Run 0 of a vmapped state, in one program (eager indexing compiles one per leaf)."""
    return jax.tree.map(lambda x: x[0], state)


def assert_only_the_actor_update_changes(setup, trainer, **change):
    """One update from the same state, with and without a change of the actor's loss: the
    critics and the temperature move the same (their losses do not use it), the actor not."""
    env, params, bank = setup
    state, _, _ = train_many(trainer, jax.random.key(1), [0, 0], chunk_epochs=2)  # the pinned job: no compile
    run = first_run(state)
    changed = make_train(dataclasses.replace(trainer.config, **change), env, params, bank)
    before, _ = jax.jit(trainer.learner.update)(run, HParams())
    after, _ = jax.jit(changed.learner.update)(run, HParams())
    for a, b in zip(jax.tree.leaves((before.critic, before.log_alpha)),
                    jax.tree.leaves((after.critic, after.log_alpha)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # (two programs: rounding may differ)
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(before.actor),
                                                            jax.tree.leaves(after.actor), strict=True))
    assert gap > 1e-6


def test_a_risk_averse_actor_changes_the_actor_update_and_not_the_critics(setup, trainer):
    """TrainConfig.actor_cvar reaches the actor's loss and no other."""
    assert_only_the_actor_update_changes(setup, trainer, actor_cvar=0.25)
    for level in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"actor_cvar must be in \(0, 1\]"):
            TrainConfig(actor_cvar=level)


def test_action_smoothing_changes_the_actor_update_and_not_the_critics(setup, trainer):
    """TrainConfig.action_smoothness reaches the actor's loss and no other (its value along a
    sequence: test_recurrent); the squared change of tanh(mean) is exact."""
    from jaxrace.agents.losses import action_change

    assert_only_the_actor_update_changes(setup, trainer, action_smoothness=100.0)
    mean = jnp.asarray([[0.0, 0.0], [jnp.arctanh(0.5), 0.0]], jnp.float32)
    after = jnp.asarray([[jnp.arctanh(0.5), jnp.arctanh(-0.25)], [jnp.arctanh(0.5), 0.0]], jnp.float32)
    np.testing.assert_allclose(action_change(mean, after), [0.25 + 0.0625, 0.0], rtol=1e-6, atol=1e-7)
    for weight in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="action_smoothness must be finite and >= 0"):
            TrainConfig(action_smoothness=weight)


def test_penalty_replay_trains_on_another_batch_from_the_same_state(setup, trainer):
    """TrainConfig.penalty_replay reaches the update: from the same state and key the critics
    move otherwise than under uniform replay, and stay finite (its sampler: test_replay)."""
    env, params, bank = setup
    state, _, _ = train_many(trainer, jax.random.key(1), [0, 0], chunk_epochs=2)  # the pinned job: no compile
    run = first_run(state)
    enriched = make_train(dataclasses.replace(trainer.config, penalty_replay=0.25), env, params, bank)
    before, _ = jax.jit(trainer.learner.update)(run, HParams())
    after, _ = jax.jit(enriched.learner.update)(run, HParams())
    leaves = jax.tree.leaves(after.critic)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)
    gaps = [float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(before.critic), leaves, strict=True)]
    assert max(gaps) > 1e-6


def test_policy_averaging_keeps_a_moving_average_of_the_actor(setup, trainer):
    """TrainConfig.actor_average: after every update the average moves that share of the way to the
    actor; warm-up and a failed run leave it alone, and checkpoint selection is handed the average."""
    from jaxrace.agents.selection import KeepBest

    assert jax.eval_shape(trainer.learner.init, jax.random.key(0), HParams()).average_actor is None  # off by default
    env, params, bank = setup
    averaged = make_train(dataclasses.replace(trainer.config, actor_average=0.25), env, params, bank)
    judged = {}

    def score(epoch, actors):
        judged[epoch] = jax.tree.map(np.array, actors)
        return np.zeros(2, np.float32)

    state, metrics, _ = train_many(averaged, jax.random.key(1), [0, 1], hparams=EXPLODE, chunk_epochs=2,
                                   keep=KeepBest(score))
    assert bool(metrics.failed[1, 1]) and not bool(metrics.failed[0, -1])  # run 1 fails at its first update
    average, actor = (jax.tree.map(np.asarray, x) for x in (state.average_actor, state.actor))
    for got, want, acting in zip(jax.tree.leaves(judged[4]), jax.tree.leaves(average), jax.tree.leaves(actor),
                                 strict=True):
        np.testing.assert_array_equal(got, want)  # selection sees the average...
        np.testing.assert_array_equal(want[1], acting[1])  # ...which a failed run never moved from its start
    gap = max(float(np.max(np.abs(a[0] - m[0]))) for a, m in zip(jax.tree.leaves(actor), jax.tree.leaves(average),
                                                                 strict=True))
    assert gap > 1e-4  # run 0's average lags its actor
    # One update at a time: average <- average + 0.25 (actor - average).
    run = first_run(state)
    update = jax.jit(averaged.learner.update)
    for _ in range(2):
        before = run.average_actor
        run, _ = update(run, HParams())
        expected = jax.tree.map(lambda a, m: np.asarray(m) + 0.25 * (np.asarray(a) - np.asarray(m)), run.actor, before)
        for got, want in zip(jax.tree.leaves(run.average_actor), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match=r"actor_average must be in \[0, 1\)"):
        TrainConfig(actor_average=1.0)


def test_a_job_whose_state_cannot_fit_the_device_is_refused_before_anything_is_allocated(trainer, monkeypatch):
    keys = jax.random.split(jax.random.key(0), 2)
    hparams = runner.per_run_hparams(HParams(), 2).replace(reward_params=None)
    state = jax.eval_shape(jax.vmap(trainer.learner.init), keys, hparams)
    needed = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    device = jax.devices()[:1]
    monkeypatch.setattr(runner, "device_memory_limit", lambda d: needed)
    runner.check_job_fits(trainer.learner, keys, hparams, device)  # exactly fits
    monkeypatch.setattr(runner, "device_memory_limit", lambda d: needed - 1)
    with pytest.raises(ValueError, match=r"2 runs need .* GiB per device for their state alone .*replay_size 2,000"):
        runner.check_job_fits(trainer.learner, keys, hparams, device)
    monkeypatch.setattr(runner, "device_memory_limit", lambda d: 1 << 20)
    with pytest.raises(ValueError, match="does not fit"):  # through train_many, before its init runs
        train_many(trainer, jax.random.key(0), [0], seeds_per_reward=2, chunk_epochs=2)


def test_train_many_reports_progress_in_chunks(trainer):
    seen = []
    _, metrics, reward_index = train_many(trainer, jax.random.key(2), [0], seeds_per_reward=2, chunk_epochs=2,
                                          progress=lambda epoch, m: seen.append(epoch))
    assert seen == [2, 4] and metrics.progress.shape == (2, 4)
    np.testing.assert_array_equal(reward_index, [0, 0])


def test_the_trainer_rejects_bad_sizes():
    with pytest.raises(ValueError, match="train_length=0"):
        TrainConfig(train_length=0)
    with pytest.raises(ValueError, match="burn_in and reinit_every"):
        TrainConfig(burn_in=-1)


def test_each_env_can_get_its_own_scenario(setup):
    from jaxrace.envs import per_env_params

    env, params, bank = setup
    mixed = per_env_params(params, 4, num_active_opponents=[0, 0, 3, 3])
    assert mixed.num_active_opponents.tolist() == [0, 0, 3, 3] and mixed.time_limit.shape == (4,)
    with pytest.raises(ValueError, match="num_active_opponents needs 4 values"):
        per_env_params(params, 4, num_active_opponents=[0, 3])
    config = TrainConfig(num_envs=2, rollout_steps=4, batch_size=4, epochs=1)
    with pytest.raises(ValueError, match="leading axis of 4, but config.num_envs is 2"):
        make_train(config, env, mixed, bank)


@pytest.mark.slow
def test_learns_to_make_progress_on_a_tiny_task(setup):
    env, params, bank = setup
    config = TrainConfig(num_envs=16, rollout_steps=8, updates_per_epoch=8, batch_size=128, replay_size=50_000,
                         warmup_epochs=2, epochs=150)
    trainer = make_train(config, env, params, bank)
    _, metrics = jax.jit(lambda k: trainer.train(k, HParams(), 0))(jax.random.key(0))
    progress = np.asarray(metrics.progress)
    random_policy = progress[:2].mean()  # the warm-up epochs act uniformly at random
    learnt = progress[-20:].mean()
    assert not bool(metrics.failed[-1])
    assert learnt > 1.0 and learnt > 3 * random_policy, (random_policy, learnt)


def test_a_killed_job_resumes_from_its_checkpoint_to_the_same_result(trainer, tmp_path):
    key = jax.random.key(3)
    straight, m_straight, _ = train_many(trainer, key, [0, 0], chunk_epochs=2)
    path = tmp_path / "job.ckpt"

    class Killed(Exception):
        pass

    def kill_after_first_chunk(epoch, metrics):
        if epoch == 2:
            raise Killed

    with pytest.raises(Killed):
        train_many(trainer, key, [0, 0], chunk_epochs=2, checkpoint=path, progress=kill_after_first_chunk)
    resumed_epochs = []
    resumed, m_resumed, _ = train_many(trainer, key, [0, 0], chunk_epochs=2, checkpoint=path,
                                       progress=lambda epoch, m: resumed_epochs.append(epoch))
    assert resumed_epochs == [4]  # only the second chunk ran again
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(m_straight.critic_loss, m_resumed.critic_loss)


def _networks(state):
    return {"actor": state.policy_actor, "critic": state.critic, "log_alpha": state.log_alpha}


def test_a_warm_started_job_trains_on_from_the_networks_it_is_given(trainer):
    """train_many(start_from=): started from a fresh init's own networks it is the cold job, bit for
    bit; started from a trained job's, the networks, the target critic and the temperature are
    those, the rest starts fresh, and no program compiles again."""
    key = jax.random.key(6)
    cold, m_cold, _ = train_many(trainer, key, [0, 0], chunk_epochs=2)
    keys = jax.random.split(key, 2)
    fresh = committed(runner._init_runs(trainer.learner, keys, runner.per_run_hparams(HParams(), 2)))
    same, m_same, _ = train_many(trainer, key, [0, 0], chunk_epochs=2, start_from=_networks(fresh))
    for a, b in zip(jax.tree.leaves((cold.actor, cold.critic, m_cold)), jax.tree.leaves((same.actor, same.critic,
                                                                                           m_same)), strict=True):
        np.testing.assert_array_equal(a, b)

    start = _networks(cold)
    programs = (runner._collect, runner._label, runner._learn)
    compiled = [p._cache_size() for p in programs]
    warm_state = runner.warm_start(fresh, start)
    for name, given in (("actor", start["actor"]), ("critic", start["critic"]), ("target_critic", start["critic"])):
        for a, b in zip(jax.tree.leaves(getattr(warm_state, name)), jax.tree.leaves(given), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=name)
            assert a.sharding == b.sharding or a.sharding.is_equivalent_to(b.sharding, a.ndim)
    np.testing.assert_array_equal(warm_state.log_alpha, cold.log_alpha)
    np.testing.assert_array_equal(warm_state.env_state.steps, fresh.env_state.steps)
    assert int(np.asarray(warm_state.replay.current_index).max()) == 0  # an empty replay, not the cold job's

    warm, m_warm, _ = train_many(trainer, key, [0, 0], chunk_epochs=2, start_from=start)
    assert [p._cache_size() for p in programs] == compiled
    np.testing.assert_allclose(m_warm.alpha[:, 0], np.exp(np.asarray(cold.log_alpha)), rtol=1e-6)  # the warm-up
    assert not np.allclose(m_warm.critic_loss, m_cold.critic_loss)
    assert not np.asarray(m_warm.failed).any()


def test_a_held_actor_stays_as_it_started_while_its_critic_learns(trainer):
    """HParams.actor_hold_epochs: a run held past the job's epochs ends with its initial actor, Adam
    state and temperature but a trained critic; a run held 0 epochs in the same job is the cold job's
    run bit for bit, and the per-run value compiles nothing new."""
    key = jax.random.key(6)
    cold, m_cold, _ = train_many(trainer, key, [0, 0], chunk_epochs=2)
    programs = (runner._collect, runner._label, runner._learn)
    compiled = [p._cache_size() for p in programs]
    held, m_held, _ = train_many(trainer, key, [0, 0], chunk_epochs=2,
                                 hparams=HParams(actor_hold_epochs=jnp.asarray([0.0, 100.0])))
    assert [p._cache_size() for p in programs] == compiled
    run0 = jax.tree.map(lambda x: x[0], (cold.actor, cold.critic, cold.log_alpha, m_cold))
    for a, b in zip(jax.tree.leaves(run0), jax.tree.leaves(jax.tree.map(
            lambda x: x[0], (held.actor, held.critic, held.log_alpha, m_held))), strict=True):
        np.testing.assert_array_equal(a, b)
    keys = jax.random.split(key, 2)
    fresh = runner._init_runs(trainer.learner, keys, runner.per_run_hparams(HParams(), 2))
    def kept(state):  # (the optimisers' learning rates are set by each update, held or not)
        return {"actor": state.actor, "log_alpha": state.log_alpha,
                "actor_opt": state.actor_opt.inner_state, "alpha_opt": state.alpha_opt.inner_state}

    before, after = kept(fresh), kept(held)
    for name in before:
        for a, b in zip(jax.tree.leaves(before[name]), jax.tree.leaves(after[name]), strict=True):
            np.testing.assert_array_equal(np.asarray(a)[1], np.asarray(b)[1], err_msg=name)
    moved = max(float(np.max(np.abs(np.asarray(a)[1] - np.asarray(b)[1])))
                for a, b in zip(jax.tree.leaves(fresh.critic), jax.tree.leaves(held.critic), strict=True))
    assert moved > 1e-6 and trainer.config.epochs > trainer.config.warmup_epochs
    assert np.asarray(m_held.critic_loss)[1, trainer.config.warmup_epochs:].min() > 0


def test_a_warm_start_for_another_job_is_rejected_with_what_differs(trainer):
    state, _, _ = train_many(trainer, jax.random.key(6), [0, 0], chunk_epochs=2)
    start = _networks(state)
    three = jax.tree.map(lambda x: jnp.concatenate([x, x[:1]]), start)
    with pytest.raises(ValueError, match=r"start_from\['actor'\].* has shape \(3,.*2 runs"):
        train_many(trainer, jax.random.key(0), [0, 0], chunk_epochs=2, start_from=three)
    with pytest.raises(ValueError, match="lacks \\['log_alpha'\\]"):
        train_many(trainer, jax.random.key(0), [0, 0], chunk_epochs=2,
                   start_from={"actor": start["actor"], "critic": start["critic"]})


def test_a_checkpoint_from_another_job_is_rejected(setup, tmp_path):
    from jaxrace.agents.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint(tmp_path / "other.ckpt", {"a": jnp.zeros(3)}, 1)
    with pytest.raises(ValueError, match="missing: b: was it written by a different configuration"):
        load_checkpoint(path, {"a": jnp.zeros(3), "b": jnp.zeros(2)})
    with pytest.raises(ValueError, match=r"array a is float32\[3\], the job expects float32\[4\]"):
        load_checkpoint(path, {"a": jnp.zeros(4)})
    with pytest.raises(ValueError, match=r"the job expects int32\[3\]"):
        load_checkpoint(path, {"a": jnp.zeros(3, jnp.int32)})


def test_evaluation_races_every_run_and_reports_metrics(setup, trainer):
    from jaxrace.agents.evaluation import evaluate, race_metrics
    from jaxrace.envs.rollouts import trajectory

    env, params, _ = setup
    state, _, _ = train_many(trainer, jax.random.key(4), [0], seeds_per_reward=2, chunk_epochs=2)
    states, actions, metrics = evaluate(trainer, state.actor, env, params, jax.random.key(5), num_steps=30,
                                        num_races=2)
    assert states.time.shape == (2, 2, 31)
    assert actions.shape == (2, 2, 30, 2) and actions.dtype == jnp.float32
    # Race i of every run meets the same scenario: the same opponents' grid at the start.
    np.testing.assert_array_equal(states.cars.body.x[0, :, 0], states.cars.body.x[1, :, 0])
    assert len(metrics) == 2 and all(len(m) == 2 for m in metrics)
    m = metrics[0][0]
    assert m.finishing_position == 1 and m.laps == 0 and m.best_lap is None and not m.finished
    # Deterministic: the same key gives the same race.
    again, _, _ = evaluate(trainer, state.actor, env, params, jax.random.key(5), num_steps=30, num_races=2)
    np.testing.assert_array_equal(states.cars.body.x, again.cars.body.x)
    # The built-in AI finishes a short race: metrics of a finished race are filled in.
    race_env, race_params = jaxrace.make(track="oval", num_opponents=3, laps=1)
    ai = jax.jit(trajectory, static_argnums=(0, 3))(race_env, race_params, jax.random.key(6), 700)
    result = race_metrics(ai, race_params)
    assert result.finished and result.laps == 1 and result.best_lap > 0
    assert result.winning_margin is not None and (result.winning_margin > 0) == (result.finishing_position == 1)
    assert result.positions_gained == result.start_position - result.finishing_position


def test_race_metrics_place_each_incident_where_and_when_it_began():
    """Straight ahead at full throttle from the back of the grid: into the car ahead, off the course, the wall."""
    from jaxrace.agents.evaluation import race_metrics
    from jaxrace.envs.rollouts import race_record, trajectory_with_actions

    env, params = jaxrace.make(track="oval", num_opponents=3, laps=1)
    states, _ = jax.jit(lambda k: trajectory_with_actions(env, params, k, 300, policy=lambda obs: jnp.array(
        [0.0, 1.0])))(jax.random.key(6))
    result = race_metrics(states, params)
    kinds = [i["kind"] for i in result.incidents]
    assert kinds == ["at_fault", "course_out", "wall", "wall"]
    assert (kinds.count("at_fault"), kinds.count("course_out"), kinds.count("wall")) == (
        result.collisions_at_fault, result.course_outs, result.wall_hits)
    record = jax.jit(jax.vmap(lambda s: race_record(s, params)))(states)
    flags = {"at_fault": record.hit_other_from_behind, "course_out": record.off_course, "wall": record.wall_contact}
    for i in result.incidents:
        t = int(np.argmin(np.abs(np.asarray(states.time) - i["time"])))
        assert t > 0 and i["lap"] == 0 and i["time"] == pytest.approx(float(states.time[t]), abs=0.006)
        assert (i["x"], i["y"]) == pytest.approx((float(states.cars.body.x[t, 0]), float(states.cars.body.y[t, 0])),
                                                 abs=0.06)
        assert bool(flags[i["kind"]][t, 0]) and not bool(flags[i["kind"]][t - 1, 0])  # where the incident began


def test_hparams_can_differ_per_run_and_bad_lengths_are_rejected(trainer):
    sweep = HParams(critic_lr=jnp.array([3e-4, 0.0]))  # run 1's critic never moves
    state, _, _ = train_many(trainer, jax.random.key(7), [0], seeds_per_reward=2, hparams=sweep, chunk_epochs=2)
    fresh = jax.jit(jax.vmap(trainer.init, in_axes=(0, None, 0)))(jax.random.split(jax.random.key(7), 2), HParams(),
                                                          jnp.zeros(2, jnp.int32))
    first = jax.tree.leaves(state.critic)[0]
    init_first = jax.tree.leaves(fresh.critic)[0]
    assert not np.allclose(first[0], init_first[0]) and np.allclose(first[1], init_first[1])
    with pytest.raises(ValueError, match="3 values for 2 runs"):
        train_many(trainer, jax.random.key(7), [0, 0], hparams=HParams(actor_lr=jnp.ones(3)), chunk_epochs=2)


def test_the_trainer_rewards_each_run_with_its_own_candidate_and_params():
    from jaxrace.rewards.synthetic import synthetic_batch

    bank = RewardBank.from_compiled([library_reward("progress"), library_reward("gt_sophy")])
    env, params = jaxrace.make(track="oval", start="time_trial")
    config = TrainConfig(num_envs=2, rollout_steps=2, updates_per_epoch=1, batch_size=8, replay_size=100,
                         warmup_epochs=1, epochs=1)
    trainer = make_train(config, env, params, bank)
    prev, action, curr, _ = synthetic_batch()
    act = jnp.stack([action.steering, action.throttle_brake], -1)
    weights = bank.default_params() * jnp.asarray([[1.0], [2.5]])  # not the defaults
    for index in range(bank.num_rewards):
        got = jax.vmap(trainer.reward, in_axes=(None, None, 0, 0, 0))(jnp.int32(index), weights[index], prev, act,
                                                                     curr)
        want = jax.vmap(bank.evaluate, in_axes=(None, 0, 0, 0, None))(index, prev, action, curr, weights[index])[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(got, jax.vmap(bank.evaluate, in_axes=(None, 0, 0, 0))(1, prev, action, curr)[0])


def test_a_new_bank_compiles_only_the_small_labelling_program(trainer):
    from jaxrace.design.compilation import CompileClock

    programs = {f"jit({name})" for name in ("_init_runs", "_collect", "_label", "_learn")}
    with CompileClock() as first:
        _, before, _ = train_many(trainer, jax.random.key(8), [0], seeds_per_reward=2, chunk_epochs=2)
    # Another bank, with another number of PARAMS: rewards differ, the bank-free programs do not.
    other = trainer.with_bank(RewardBank.from_compiled([library_reward("gt_sophy")]))
    assert other.learner is trainer.learner and other.bank.num_params != trainer.bank.num_params
    with CompileClock() as second:
        _, after, _ = train_many(other, jax.random.key(8), [0], seeds_per_reward=2, chunk_epochs=2)
    assert [p for p in second.programs if p in programs] == ["jit(_label)"], (first.programs, second.programs)
    # Warm-up (epoch 0) acts at random from the same key: the same steps, rewarded by the new bank.
    np.testing.assert_array_equal(before.progress[:, 0], after.progress[:, 0])
    assert not np.allclose(before.reward[:, 0], after.reward[:, 0])


def test_keep_best_keeps_each_runs_best_checkpoint_and_a_resumed_job_keeps_it(trainer, tmp_path):
    from jaxrace.agents.selection import KeepBest, average_params

    seen = {}

    def score(epoch, actors):  # run 0: the later the better; run 1: the first judgement stays best
        seen[epoch] = jax.tree.map(np.asarray, actors)
        return np.array([-epoch, epoch], np.float32)

    keep = KeepBest(score)
    train_many(trainer, jax.random.key(8), [0, 0], chunk_epochs=2, keep=keep)
    assert sorted(seen) == [2, 4] and keep.epoch.tolist() == [4, 2] and keep.score.tolist() == [-4.0, 2.0]
    for kept, last, first in zip(jax.tree.leaves(keep.actor), jax.tree.leaves(seen[4]), jax.tree.leaves(seen[2]),
                                 strict=True):
        np.testing.assert_array_equal(kept[0], last[0])
        np.testing.assert_array_equal(kept[1], first[1])

    class Killed(Exception):
        pass

    def kill_after_first_chunk(epoch, metrics):
        if epoch == 2:
            raise Killed

    path = tmp_path / "job.ckpt"
    with pytest.raises(Killed):
        train_many(trainer, jax.random.key(8), [0, 0], chunk_epochs=2, checkpoint=path, keep=KeepBest(score),
                   progress=kill_after_first_chunk)
    resumed = KeepBest(score)
    train_many(trainer, jax.random.key(8), [0, 0], chunk_epochs=2, checkpoint=path, keep=resumed)
    assert resumed.epoch.tolist() == [4, 2] and resumed.history == [(2, [-2.0, 2.0]), (4, [-4.0, 4.0])]
    for a, b in zip(jax.tree.leaves(keep.actor), jax.tree.leaves(resumed.actor), strict=True):
        np.testing.assert_array_equal(a, b)
    # Judged every second chunk only: the first chunk's actors are never judged, nor kept.
    sparse = KeepBest(score, every=2)
    train_many(trainer, jax.random.key(8), [0, 0], chunk_epochs=2, keep=sparse)
    assert sparse.epoch.tolist() == [4, 4] and [e for e, _ in sparse.history] == [4]
    # Weight averaging: at epoch 4 each run's average of its actors at 2 and 4 is judged; run 0 keeps
    # it, run 1 the epoch-2 actor. A job killed after its first chunk resumes with what it averages.
    raw = dict(seen)
    averaged = KeepBest(score, average=2)
    train_many(trainer, jax.random.key(8), [0, 0], chunk_epochs=2, keep=averaged)
    want = average_params([raw[2], raw[4]])
    for kept, mean, first in zip(jax.tree.leaves(averaged.actor), jax.tree.leaves(want), jax.tree.leaves(raw[2]),
                                 strict=True):
        np.testing.assert_array_equal(kept[0], mean[0])
        np.testing.assert_array_equal(kept[1], first[1])
    with pytest.raises(Killed):
        train_many(trainer, jax.random.key(8), [0, 0], chunk_epochs=2, checkpoint=tmp_path / "avg.ckpt",
                   keep=KeepBest(score, average=2), progress=kill_after_first_chunk)
    resumed = KeepBest(score, average=2)
    train_many(trainer, jax.random.key(8), [0, 0], chunk_epochs=2, checkpoint=tmp_path / "avg.ckpt", keep=resumed)
    for a, b in zip(jax.tree.leaves(averaged.actor), jax.tree.leaves(resumed.actor), strict=True):
        np.testing.assert_array_equal(a, b)


def test_assess_reports_each_race_as_its_totals_do(setup, trainer):
    """selection.assess: per-race finishes, course-outs and at-fault contacts, consistent with the
    totals (the train_reference results list them, to tell a slow race from one that ran out of
    time; checkpoint_hindsight keeps them to re-score a subset of the selection races)."""
    from jaxrace.agents.evaluation import evaluate
    from jaxrace.agents.selection import assess
    from jaxrace.envs import race_fields

    env, params, _ = setup  # a time trial as the "race": the trainer's observation shape
    fields = race_fields(params, jax.random.key(5), 3)
    actors = jax.tree.map(lambda x: x[None], jax.jit(trainer.init)(jax.random.key(4), HParams(), 0).actor)
    key = jax.random.key(6)
    (got,) = assess(trainer, actors, 36.0, key, race_env=env, race_fields=fields, race_steps=60)
    raced = evaluate(trainer, actors, env, fields, jax.random.split(key)[1], 60, num_races=3,
                     params_per_race=True)
    races = raced.metrics[0]
    assert got.finished == (False, False, False)  # 6 s of a 36 s lap
    change = np.square(np.diff(np.asarray(raced.actions[0], np.float64), axis=1)).mean(axis=(0, 1))
    np.testing.assert_allclose(got.action_change, change, rtol=1e-9)  # nobody finished: every step counts
    assert got.outs_by_race == tuple(m.course_outs for m in races) and sum(got.outs_by_race) == got.course_outs
    assert got.at_fault_by_race == tuple(m.collisions_at_fault for m in races)
    assert sum(got.at_fault_by_race) == got.at_fault
    assert got.positions == tuple(m.finishing_position for m in races) and got.lap is None


def test_assess_counts_at_fault_contacts_race_by_race_among_opponents():
    """Full throttle, straight ahead, from the back of a 4-car grid: at-fault contacts, course-outs
    and wall hits differ per race, so each per-race field must come from its own metric."""
    from jaxrace.agents.evaluation import evaluate
    from jaxrace.agents.selection import assess
    from jaxrace.envs import race_fields

    env, params = jaxrace.make(track="oval", start="grid_back", num_opponents=3, laps=1)
    racer = small_trainer((env, params, small_setup()[2]))
    actors = jax.tree.map(lambda x: x[None], jax.jit(racer.init)(jax.random.key(4), HParams(), 0).actor)
    mean = actors["params"]["Dense_1"]  # the mean head: tanh(mean) is the deterministic action (steer, throttle)
    actors["params"]["Dense_1"] = {"kernel": jnp.zeros_like(mean["kernel"]), "bias": jnp.array([[0.0, 3.0]])}
    fields, key = race_fields(params, jax.random.key(5), 3), jax.random.key(6)
    (got,) = assess(racer, actors, 36.0, key, race_env=env, race_fields=fields, race_steps=150)
    races = evaluate(racer, actors, env, fields, jax.random.split(key)[1], 150, num_races=3,
                     params_per_race=True).metrics[0]
    assert got.at_fault_by_race == (1, 1, 0) == tuple(m.collisions_at_fault for m in races)
    assert got.outs_by_race == (1, 1, 1) == tuple(m.course_outs for m in races)
    assert tuple(m.wall_hits for m in races) == (2, 2, 2)
    assert (got.at_fault, got.course_outs, got.positions) == (2, 3, (4, 4, 4))


if __name__ == "__main__":  # the training pin's digest on this CPU
    print(f'TRAINING_DIGEST = "{training_digest(small_trainer())}"')
