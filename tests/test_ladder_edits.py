"""gpu_runs/ladder_edits.py's prompts: code edits made from the code-prompts source's function sources,
each an edit instruction and the whole function, as many as asked, the same every time."""

from tests.helpers import load_script


def test_edit_prompts_hold_an_instruction_and_a_whole_function():
    le = load_script("gpu_runs/ladder_edits.py")
    prompts = le.edit_prompts(12)
    assert len(prompts) == 12 and [p.turns for p in le.edit_prompts(12)] == [p.turns for p in prompts]
    for i, p in enumerate(prompts):
        (text,) = p.turns
        instruction, code = text.split("\n\n", 1)
        assert instruction == le.EDITS[i % len(le.EDITS)]
        assert code.startswith("```python\n") and code.rstrip().endswith("```") and "def " in code
    assert len({p.turns[0] for p in prompts}) == 12
