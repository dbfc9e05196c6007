import dataclasses
import inspect

import jaxrace.rewards.api as api
from jaxrace.rewards import Action, RaceView, api_text


def test_api_text_documents_every_field_from_the_one_definition():
    text = api_text()
    source = inspect.getsource(api)
    for cls in (RaceView, Action):
        for field in dataclasses.fields(cls):
            assert f"    {field.name}: jax.Array\n" in text, field.name
    # Each field's docstring appears verbatim, taken from the module source.
    for block in source.split('"""')[1::2]:
        if block.startswith(("f32", "bool", "i32")):
            assert block in text
    assert "def reward(prev: RaceView, action: Action, curr: RaceView, params: dict)" in text
    assert "jnp.where" in text and "PARAMS" in text and "NO_GAP = 10_000.0" in text
    assert "@struct.dataclass" not in text and "import" not in text.split("class RaceView")[0]


def test_synthetic_views_take_the_api_dtypes_and_refuse_unknown_fields():
    import jax.numpy as jnp
    import pytest

    from jaxrace.rewards.api import RaceView, field_dtypes
    from jaxrace.rewards.synthetic import DEFAULT_VIEW, action, view

    v = view(speed=12.0, rank=2, off_course=True)
    assert isinstance(v, RaceView) and set(DEFAULT_VIEW) == set(field_dtypes(RaceView))
    assert {k: getattr(v, k).dtype for k in DEFAULT_VIEW} == field_dtypes(RaceView)
    assert float(v.speed) == 12.0 and int(v.rank) == 2 and bool(v.off_course)
    assert float(v.progress) == DEFAULT_VIEW["progress"]
    assert action(0.5).steering.dtype == jnp.float32 and float(action(0.5).throttle_brake) == 1.0
    with pytest.raises(TypeError, match="spd"):
        view(spd=1.0)
