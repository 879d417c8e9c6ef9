"""The Guarantees table (docs/guarantees-table.md) is the chaos suite's own output: it must carry
the hash of the scenario list and harness as they are now (rerun `make chaos` after changing
them), and it warns, without failing, when the service's code changed since the commit it was
measured on."""

from __future__ import annotations

import warnings

from chaos.scenarios import SCENARIOS
from chaos.table import TABLE, harness_hash, service_changed_since, table_stamp


def test_the_committed_table_was_written_by_this_harness():
    text = TABLE.read_text(encoding="utf-8")
    stamped, commit = table_stamp(text)
    assert commit is not None, "the table names no commit: write it with `make chaos`"
    assert stamped == harness_hash(), (
        f"docs/guarantees-table.md was written by harness {stamped}, the harness is now {harness_hash()}: "
        "rerun `make chaos` and commit the table"
    )
    for name in SCENARIOS:
        assert f"| {name} |" in text, f"scenario {name} is missing from the table"


def test_the_table_warns_when_the_service_changed_since_it_was_measured():
    _, commit = table_stamp(TABLE.read_text(encoding="utf-8"))
    assert commit is not None
    try:
        changed = service_changed_since(commit)
    except LookupError as exc:  # a clone without that commit (shallow): nothing to compare with
        changed = [f"(cannot compare: {exc})"]
    if changed:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # a warning in the summary, not a failure
            warnings.warn(
                f"docs/guarantees-table.md was measured at {commit[:12]}; since then {len(changed)} files of "
                f"worker/, api/, common/ changed (e.g. {changed[0]}): rerun `make chaos`",
                UserWarning,
                stacklevel=1,
            )
