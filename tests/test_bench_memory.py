"""``bench/bench_memory.py``'s printed output: every figure under one heading."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_every_figure_is_under_exactly_one_heading() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import bench_memory
    finally:
        sys.path.remove(str(BENCH))
    out: dict[str, float] = {"log_cap": 20_000}
    for tag in ("ephemeral", "persistent"):
        for mult in (1, 2, 5, 10):
            out[f"{tag}_{mult}x_records"] = 1
            out[f"{tag}_{mult}x_rss_mib"] = 1.0
            out[f"{tag}_{mult}x_pair_index_mib"] = 1.0
        out[f"{tag}_rss_bytes_per_record_1x_to_10x"] = 1.0
        out[f"{tag}_baseline_bytes_per_record"] = 33
    out["persistent_1x_data_file_after_compact_mib"] = 1.0
    out["persistent_10x_data_file_after_compact_mib"] = 1.0
    groups = bench_memory.sections(out)
    listed = [k for _, keys in groups for k in keys]
    assert sorted(listed) == sorted(out)  # each once
    by_heading = {heading.split(":")[0]: keys for heading, keys in groups}
    assert by_heading[
        "data file (MiB of data.mdb) after a close and compact(), history retention 5 minutes"
    ] == ["persistent_1x_data_file_after_compact_mib", "persistent_10x_data_file_after_compact_mib"]
    assert all(
        "MiB of RSS above the start" in h for h, keys in groups if "ephemeral_1x_rss_mib" in keys
    )
