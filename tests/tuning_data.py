"""Programs and clips with a known answer, shared by the weight-tuning tests."""

import numpy as np

LINEAR = '''
PARAMS = {"w_speed": 1.0, "w_off": 1.0}

def reward(prev, action, curr, params):
    off = curr.off_course.astype(jnp.float32)
    return params["w_speed"] * curr.speed - params["w_off"] * off, {"speed": curr.speed, "off": off}
'''


def racing_clips(pairs=150, steps=8, seed=0):
    """2 x pairs clips: each a constant speed in [20, 40] m/s and course-outs at its own rate; labels from
    the truth speed - 20 off_course (a Boltzmann judge, beta 2), which the linear program weighs 20x too little."""
    import jax

    from jaxrace.rewards import synthetic
    from jaxrace.rewards.clips import Clip

    rng = np.random.default_rng(seed)
    k = 2 * pairs
    speed = rng.uniform(20, 40, size=k).astype(np.float32)
    off = rng.uniform(size=(k, steps + 1)) < rng.uniform(size=(k, 1))
    view = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (k, steps + 1)).copy(), synthetic.view())
    view = view.replace(speed=np.repeat(speed[:, None], steps + 1, 1), off_course=off)
    action = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (k, steps)).copy(), synthetic.action())
    clips = Clip(views=view, actions=action, valid=np.ones((k, steps), bool))
    truth = speed - 20.0 * off[:, 1:].mean(axis=1)
    d = (truth[:pairs] - truth[pairs:]) / truth.std()
    labels = np.where(rng.uniform(size=pairs) < 1 / (1 + np.exp(-2.0 * d)), 1.0, -1.0).astype(np.float32)
    first = jax.tree.map(lambda x: x[:pairs], clips)
    second = jax.tree.map(lambda x: x[pairs:], clips)
    return first, second, labels


