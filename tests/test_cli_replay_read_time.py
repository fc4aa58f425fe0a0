"""``replay --scores-out`` when the run replays no row (``--append`` with
``--skip-rows`` at the end of the log, or a log of a header alone): the scores are
read at the store's last event time, as ``inspect`` reads them, not at 0 (1970),
which read every score as 0. The expected scores are the hand log's, computed by
hand in ``test_cli``."""

from __future__ import annotations

import json
from pathlib import Path

from . import test_cli
from .test_cli import HAND_FLAGS, HAND_LOG, HAND_SCORES, H, Run, T, assert_scores, read_scores

run = test_cli.run  # the fixture: the command line in a subprocess, and on the reference model

ROWS = HAND_LOG.count("\n") - 1  # the header is no row


def test_no_row_replayed_reads_at_the_stores_last_event(run: Run, tmp_path: Path) -> None:
    log, data = tmp_path / "hand.csv", tmp_path / "data"
    scores, report = tmp_path / "scores.csv", tmp_path / "report.json"
    log.write_text(HAND_LOG)
    assert run("replay", log, *HAND_FLAGS, "--data-dir", data, "--quiet").code == 0
    res = run(
        "replay", log, "--data-dir", data, "--append", "--skip-rows", ROWS,
        "--scores-out", scores, "--report-out", report, "--quiet",
    )  # fmt: skip
    assert res.code == 0, res
    assert json.loads(report.read_text())["at_ns"] == T + 3 * H
    assert_scores(read_scores(scores), HAND_SCORES, 1e-12)
    assert f"rows at {T + 3 * H} (1970-01-01 13:00:00.000 UTC) -> {scores}" in res.out, res.out

    header_only = tmp_path / "empty.csv"
    header_only.write_text(HAND_LOG.splitlines()[0] + "\n")
    res = run(
        "replay", header_only, "--data-dir", data, "--append", "--at", "-1h",
        "--scores-out", scores, "--report-out", report, "--quiet",
    )  # fmt: skip
    assert res.code == 0, res
    assert json.loads(report.read_text())["at_ns"] == T + 2 * H  # an offset from it too
    assert_scores(read_scores(scores), test_cli.HAND_SCORES_AT_2H, 1e-12)
