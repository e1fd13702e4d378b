"""How the suite's page prints numbers: the same from the suite's results and from their JSON file."""

from __future__ import annotations

import json

from bench import _scenario as sc


def test_counts_read_the_same_before_and_after_the_json_round_trip() -> None:
    # The suite writes the page from the JSON (where int keys become strings); bench.report
    # rewrites it from the file: both must print the counts alike, in size order.
    counts = {8: 3, 1: 171, 10: 2}
    assert sc.fmt_counts(counts) == "1: 171, 8: 3, 10: 2"
    assert sc.fmt_counts(json.loads(json.dumps(counts))) == sc.fmt_counts(counts)
