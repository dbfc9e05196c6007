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
