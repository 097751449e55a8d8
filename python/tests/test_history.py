"""fedfleet.History: the command's tables as DataFrames, and checkpoints as modules."""
import csv
import io
import sqlite3

import pandas as pd
import pytest

import fedfleet
from conftest import run_cli, small_config


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    db = tmp_path_factory.mktemp("hist") / "h.db"
    cfg = fedfleet.Config(**{"data.format": "synthetic", "sim.clients": 30,
                             "coordinator.clients_per_round": 5, "run.rounds": 3,
                             "model.name": "logreg", "run.seed": 5})
    return fedfleet.simulate(cfg, db=db, progress=False)


def test_rounds_equal_the_commands_csv_cell_for_cell(synthetic_run, fedfleet_bin):
    run = synthetic_run
    for view, frame in [("rounds", run.rounds()), ("updates", run.updates()),
                        ("runs", fedfleet.History(run.path).runs()),
                        ("events", fedfleet.History(run.path).events())]:
        p = run_cli(fedfleet_bin, "history", view, "--db", run.path, "--format", "csv")
        rows = list(csv.reader(io.StringIO(p.stdout)))
        if len(rows) <= 1 and frame.empty:
            continue
        assert list(frame.columns) == rows[0], view
        assert len(frame) == len(rows) - 1, view
        expected = pd.read_csv(io.StringIO(p.stdout), float_precision="round_trip")
        pd.testing.assert_frame_equal(frame, expected, check_exact=True)
        # Cell for cell against the text: every value reads back to what the command printed.
        for i, row in enumerate(rows[1:]):
            for j, text in enumerate(row):
                cell = frame.iat[i, j]
                if text == "":
                    assert pd.isna(cell), (view, i, j)
                elif isinstance(cell, float):
                    assert cell == float(text), (view, i, j, text)
                else:
                    assert str(cell) == text, (view, i, j, text)


def test_rounds_match_the_database(synthetic_run):
    frame = synthetic_run.rounds()
    con = sqlite3.connect(synthetic_run.path)
    stored = con.execute("SELECT round, test_accuracy FROM rounds WHERE run_id = ? ORDER BY round",
                         (synthetic_run.run_id,)).fetchall()
    assert list(frame["round"]) == [r for r, _ in stored]
    assert list(frame["test_accuracy"]) == pytest.approx([a for _, a in stored], abs=0)
    assert len(stored) == 4  # round 0 and 3 training rounds


def test_a_missing_file_and_a_missing_run_raise():
    with pytest.raises(fedfleet.ConfigError, match="no such history file"):
        fedfleet.History("/nonexistent/h.db")


def test_a_missing_run_is_the_commands_error(synthetic_run):
    with pytest.raises(fedfleet.ConfigError, match="run 99"):
        fedfleet.History(synthetic_run.path).rounds(run=99)


def test_report_is_written(synthetic_run, tmp_path):
    path = synthetic_run.report(tmp_path / "r.html")
    text = open(path).read()
    assert text.startswith("<!DOCTYPE html>") or "<html" in text[:200]
