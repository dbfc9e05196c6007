"""Training configuration: `TrainConfig` (static: shapes and loop lengths) and `HParams` (traced)."""

from __future__ import annotations

import dataclasses

import jax
from flax import struct

from jaxrace.agents.networks import NetworkConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Static training configuration (shapes and loop lengths)."""

    network: NetworkConfig = NetworkConfig(recurrent=False)
    num_envs: int = 16
    rollout_steps: int = 8  # env steps per env per epoch
    updates_per_epoch: int = 8
    batch_size: int = 128
    replay_size: int = 50_000  # transitions
    n_step: int = 3
    warmup_epochs: int = 2  # uniform random actions, no updates
    epochs: int = 100
    burn_in: int = 16  # recurrent actor only: replayed steps that warm the GRU state, no gradients
    train_length: int = 32  # recurrent actor only: trained steps per sampled sequence
    reinit_every: int = 0  # epochs between re-initialisations of the networks (primacy bias); 0: never
    # Policy averaging: after each gradient update the state's average actor moves this share of the
    # way to the actor (an exponential moving average; 0: none). The envs are driven by the actor;
    # evaluation, checkpoint selection and the saved agents use the average (`TrainState.policy_actor`).
    # Static: each value compiles its own programs (it is not an HParams field, swept per run).
    actor_average: float = 0.0
    # Risk-averse actor: it maximises the mean of the lowest `actor_cvar` share of the critic's
    # quantiles (the CVaR of the return), so rare costly outcomes (a contact, a course-out) weigh
    # more than their probability. 1: the mean of all of them (QR-SAC as usual). The critics are
    # unchanged. Static, like actor_average.
    actor_cvar: float = 1.0
    # Action smoothing (temporal smoothness, as CAPS): the actor's loss also pays this weight times
    # the squared distance between its evaluation actions (tanh of the mean) at a replayed state and
    # at the state after it, so the policy does not flick its steering and pedal from one step to
    # the next. The env and the reward are unchanged. 0: none. Static, like actor_average.
    action_smoothness: float = 0.0
    # Penalty-enriched replay: this share of each batch is the sequences with the lowest reward in
    # them among 4x as many uniform candidates (`replay.make_sampler`), so the rare states before
    # a contact or a course-out are fitted more often. 0: uniform replay. Static, like actor_average.
    penalty_replay: float = 0.0
    # Each update its own jitted call from a host loop, not a scan inside `learn`: XLA:CPU
    # differentiates a convolution inside a loop ~25x slower (docs/reference_agent.md, "The pixel actor on CPU").
    # Split programs only (`train_many(fused=False)`); the results are the same.
    host_updates: bool = False
    # The runs of a job one after another in each training program (unrolled), not vmapped:
    # vmapped over runs with their own weights, a CNN's convolutions become grouped ones, which
    # XLA:CPU runs about 3x and XLA:GPU (an H100) 33-43x slower than the runs' convolutions one at
    # a time (experiments/bench_run_conv.py). For the pixel actor; the results are the same, and
    # each program is R copies of one run's (each device's share, when the runs are split over
    # several), so its compile time grows with the runs.
    sequential_runs: bool = False

    def __post_init__(self):
        positive = ("n_step", "num_envs", "rollout_steps", "batch_size", "train_length")
        if any(getattr(self, name) < 1 for name in positive):
            raise ValueError(f"{', '.join(positive)} must be positive: got "
                             + ", ".join(f"{n}={getattr(self, n)}" for n in positive))
        if self.burn_in < 0 or self.reinit_every < 0:
            raise ValueError(f"burn_in and reinit_every must be >= 0: got {self.burn_in}, {self.reinit_every}")
        if not 0.0 <= self.actor_average < 1.0:
            raise ValueError(f"actor_average must be in [0, 1) (0: no averaging), got {self.actor_average}")
        if not 0.0 < self.actor_cvar <= 1.0:
            raise ValueError(f"actor_cvar must be in (0, 1] (1: risk-neutral), got {self.actor_cvar}")
        if not 0.0 <= self.penalty_replay <= 1.0:
            raise ValueError(f"penalty_replay must be in [0, 1] (0: uniform replay), got {self.penalty_replay}")
        if not 0.0 <= self.action_smoothness < float("inf"):
            raise ValueError(f"action_smoothness must be finite and >= 0 (0: none), got {self.action_smoothness}")

    @property
    def trained_steps(self) -> int:
        """Steps per sampled sequence that get losses (1 for the feed-forward actor)."""
        return self.train_length if self.network.recurrent else 1

    @property
    def burn_in_steps(self) -> int:
        return self.burn_in if self.network.recurrent else 0

    @property
    def sequence_length(self) -> int:
        """Steps per sampled replay sequence: burn-in, trained steps, n-step tail.

        With pixels one more step: its image is the next frame of the last bootstrap step.
        """
        pixels = self.network.actor_input == "pixels"
        return self.burn_in_steps + self.trained_steps + self.n_step - 1 + pixels

    @property
    def carry_size(self) -> int:
        """The actor's recurrent state per env (0 without a GRU: nothing stored)."""
        return self.network.carry_size


@struct.dataclass
class HParams:
    """Traced hyperparameters of one run (vmap over them for a sweep)."""

    actor_lr: jax.Array = 3e-4
    critic_lr: jax.Array = 3e-4
    alpha_lr: jax.Array = 3e-4
    discount: jax.Array = 0.99
    target_entropy: jax.Array = -2.0
    tau: jax.Array = 0.005  # polyak rate of the target critics
    initial_alpha: jax.Array = 0.1
    reward_scale: jax.Array = 1.0  # the critic learns scale * reward (keeps returns near O(10-100))
    reward_params: jax.Array | None = None  # f32[P] the candidate's PARAMS (None: its defaults)
    # Epochs after the warm-up in which each update leaves the actor, its moving average and the
    # temperature as they are and trains the critics alone. For a run that starts from another
    # reward's agent (`train_many(start_from=)`): its critic first learns the new reward's values
    # under the policy it was given, instead of the actor following the old reward's critic.
    actor_hold_epochs: jax.Array = 0.0
