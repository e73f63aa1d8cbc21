"""scripts/serve_load.py's exactness column: each cell's answers against the ar server's with one
client, prompt by prompt."""

from __future__ import annotations

from tests.helpers import load_script


def _script():
    return load_script("scripts/serve_load.py")


def test_identical_answers_against_ar_with_one_client():
    rows = [{"mode": "spec", "clients": 8, "answers": {0: "a", 1: "b", 2: "c", 5: "x"}},
            {"mode": "ar", "clients": 1, "answers": {0: "a", 1: "b", 2: "different"}},
            {"mode": "off", "clients": 8, "answers": {7: "y"}}]
    _script().identical_answers(rows)
    assert [r["identical_to_ar1"] for r in rows] == [round(2 / 3, 4), 1.0, None]  # prompt 5 and 7: no reference
    assert all("answers" not in r for r in rows)
