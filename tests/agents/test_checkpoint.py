"""Checkpoints through orbax: a state with a field added since a step was written."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxrace.agents.checkpoint import load_checkpoint, save_checkpoint


@struct.dataclass
class Before:
    actor: dict
    key: jax.Array


@struct.dataclass
class After:  # a field added later, empty unless an option asks for it (TrainState.average_actor)
    actor: dict
    key: jax.Array
    average: dict | None = None


def test_a_step_written_before_an_empty_field_existed_still_loads(tmp_path):
    actor = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    save_checkpoint(tmp_path / "old", Before(actor=actor, key=jax.random.key(3)), 5)
    template = After(actor=jax.tree.map(jnp.zeros_like, actor), key=jax.random.key(0))
    state, step = load_checkpoint(tmp_path / "old", template)
    assert step == 5 and state.average is None
    np.testing.assert_array_equal(state.actor["w"], actor["w"])
    np.testing.assert_array_equal(jax.random.key_data(state.key), jax.random.key_data(jax.random.key(3)))
    # A field that holds arrays is never made up: a step without it is refused.
    with pytest.raises(ValueError, match="missing: average"):
        load_checkpoint(tmp_path / "old", template.replace(average=template.actor))
