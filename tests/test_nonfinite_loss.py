"""A loss that diverged to NaN or infinity is recorded and shown as such, never as its last finite value, and every
`--json` output stays strict JSON. (A program whose loss turns NaN, through `dsctl up`: tests/test_run_endings.py.)"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from dsctl.cli.render import print_json, strict_json, training_rows
from dsctl.orchestrator.endings import diverged
from dsctl.orchestrator.store import RunStore
from dsctl.orchestrator.summary import loss_summary


def window(trainer: int, t_end: float, loss: float | None, batches: int = 10) -> dict:
    return {"trainer": trainer, "t_start": t_end - 1.0, "t_end": t_end, "batches": batches, "loss": loss}


def refuse(token: str):
    raise ValueError(f"not strict JSON: {token}")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nonfinite_loss_is_stored_read_back_and_summarized_as_itself(home, bad):
    store = RunStore()
    for w in (window(0, 1.0, 2.5), window(0, 2.0, 1.5), window(0, 3.0, bad)):
        store.add_window("r", w, workers=1)
    [*_, last] = store.windows("r")
    assert last["loss"] is not None and (math.isnan(last["loss"]) if math.isnan(bad) else last["loss"] == bad)
    summary = loss_summary(store.windows("r"))
    assert summary["loss_first"] == 2.5
    assert math.isnan(summary["loss_last"]) if math.isnan(bad) else summary["loss_last"] == bad
    assert summary["loss_nonfinite"] == {"trainer": 0, "value": {math.inf: "inf", -math.inf: "-inf"}.get(bad, "nan"),
                                         "batches": 30}


def test_the_first_nonfinite_window_is_named_across_trainers():
    summary = loss_summary([window(0, 1.0, 1.0), window(1, 1.5, 1.0), window(1, 2.5, math.inf), window(0, 3.0, math.nan)])
    assert summary["loss_nonfinite"] == {"trainer": 1, "value": "inf", "batches": 20}
    assert "loss_nonfinite" not in loss_summary([window(0, 1.0, 1.0)])


def test_json_output_is_strict_and_says_nan_and_infinity():
    data = {"summary": {"loss_last": math.nan, "loss_first": -math.inf, "rates": [1.0, math.inf]}}
    assert strict_json(data) == {"summary": {"loss_last": "NaN", "loss_first": "-Infinity", "rates": [1.0, "Infinity"]}}


def test_print_json_never_writes_a_bare_nan(capsys):
    print_json({"loss_last": math.nan})
    out = capsys.readouterr().out
    assert json.loads(out, parse_constant=refuse) == {"loss_last": "NaN"}


def test_the_summary_table_says_the_loss_diverged_and_where():
    summary = {"loss_first": 2.3, "loss_last": math.nan, "loss_nonfinite": {"trainer": 0, "value": "nan", "batches": 612}}
    record = SimpleNamespace(summary=summary, resumed_from=None, checkpoint_dir=None)
    [(name, text)] = training_rows(record, [])
    assert name == "loss" and "nan in the last" in text
    assert "nan (not a finite number: the model diverged) from trainer 0's window ending at batch 612" in text


def test_a_spec_that_asks_for_it_fails_the_run_at_the_first_nonfinite_window():
    assert diverged(0, {"loss": 1.5}, 10) is None and diverged(0, {}, 10) is None
    why = diverged(1, {"loss": math.nan}, 612)
    assert why is not None and "trainer 1's loss was nan in its window ending at batch 612" in why
    assert "trainer.nonfinite_loss: fail" in why
