"""QR-SAC agents: networks, losses, replay, acting, the batched trainer and its host-side runner."""

from jaxrace.agents.config import HParams, TrainConfig
from jaxrace.agents.networks import NetworkConfig
from jaxrace.agents.runner import train_many
from jaxrace.agents.trainer import Metrics, Trainer, TrainState, make_train

__all__ = ["HParams", "Metrics", "NetworkConfig", "TrainConfig", "TrainState", "Trainer", "make_train", "train_many"]
