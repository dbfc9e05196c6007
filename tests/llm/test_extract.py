"""Programs out of replies of every shape, and duplicates by syntax tree."""

from jaxrace.llm.extract import extract_program, normalised

PROGRAM = 'PARAMS = {"w": 1.0}\n\n\ndef reward(prev, action, curr, params):\n    r = params["w"] * curr.speed\n' \
          '    return r, {"speed": r}\n'


def test_fenced_with_prose():
    got = extract_program(f"Here you go:\n\n```python\n{PROGRAM}```\n\nIt rewards speed.")
    assert got.source == PROGRAM and not got.problem


def test_odd_fences():
    for fence, lang in (("```", ""), ("```", "py"), ("~~~", "python"), ("````", "Python"), ("```", "python3")):
        got = extract_program(f"text\n{fence}{lang}\n{PROGRAM}{fence}\nmore")
        assert got.source == PROGRAM, (fence, lang)


def test_several_blocks_take_the_one_defining_reward():
    helper = "def helper(x):\n    return x\n"
    shell = "pip install jax\n"
    text = f"First a helper:\n```python\n{helper}```\nRun\n```bash\n{shell}```\nThe program:\n```python\n{PROGRAM}```"
    assert extract_program(text).source == PROGRAM
    # two full programs: the last (LLMs put the corrected one last)
    second = PROGRAM.replace("1.0", "2.0")
    assert extract_program(f"```python\n{PROGRAM}```\nBetter:\n```python\n{second}```").source == second


def test_unfenced_code_among_prose():
    text = f"Sure! Here is a reward.\n\n{PROGRAM}\nThis pays for speed, which fits the task."
    assert extract_program(text).source == PROGRAM


def test_truncated_replies_are_refused_with_a_reason():
    cut = f"```python\n{PROGRAM[:60]}"
    by_length = extract_program(cut, finish_reason="length")
    assert by_length.source is None and by_length.truncated and "finish_reason=length" in by_length.problem
    open_fence = extract_program(f"```python\n{PROGRAM}", finish_reason="stop")
    assert open_fence.source is None and open_fence.truncated and "never closes" in open_fence.problem


def test_no_code():
    got = extract_program("I cannot help with that.")
    assert got.source is None and "no program" in got.problem
    blocks = extract_program("```python\nx = 1\n```")
    assert blocks.source is None and "defines `def reward(...)`" in blocks.problem


def test_normalised_ignores_docstrings_comments_and_layout_not_weights():
    a = '"""Proposal 1."""\n' + PROGRAM
    b = '"""Proposal 2, other words."""\n# a comment\n' + PROGRAM.replace("r = ", "r  =  ")
    assert normalised(a) == normalised(b) == normalised(PROGRAM)
    assert normalised(PROGRAM) != normalised(PROGRAM.replace("1.0", "1.5"))
    assert normalised("def (") == normalised("def (")  # unparseable: hashed as text
