"""`make audit`: every locked dependency (requirements.lock) against the advisories published
for it (pip-audit, PyPI's vulnerability data). Exit 1 when one is found that .ci/audit-ignore
does not list, with its id, package and fixed versions; 0 when none is; 3, with one line, when
the vulnerability data cannot be reached from this machine (nothing audited)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IGNORE = ROOT / ".ci" / "audit-ignore"
LINE = re.compile(r"^(\S+)\s+(\d{4}-\d{2}-\d{2})\s+(\S.*)$")


def ignored() -> list[str]:
    ids = []
    for raw in IGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = LINE.match(line)
        if found is None:
            sys.exit(f"audit: {IGNORE.name}: '{line}' is not '<id> <YYYY-MM-DD> <reason>'")
        ids.append(found[1])
    return ids


def main() -> int:
    lock = str(ROOT / "requirements.lock")
    argv = [sys.executable, "-m", "pip_audit", "--disable-pip", "--requirement", lock,
            "--format", "json", "--progress-spinner", "off"]  # fmt: skip
    for vuln in ignored():
        argv += ["--ignore-vuln", vuln]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        print(f"audit: pip-audit failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return 1
    code, lines = verdict(report)
    for line in lines:
        print(line, file=sys.stderr if code else sys.stdout)
    return code


def verdict(report: dict[str, Any]) -> tuple[int, list[str]]:
    """pip-audit's JSON report (the ignored advisories already left out) -> the exit code and
    what to say."""
    deps = report.get("dependencies", [])
    audited = [d for d in deps if "skip_reason" not in d]
    found = [(d["name"], d["version"], v) for d in audited for v in d.get("vulns", [])]
    if found:
        lines = []
        for name, version, vuln in found:
            fixed = ", ".join(vuln.get("fix_versions", [])) or "none yet"
            lines.append(f"audit: {vuln['id']} in {name} {version} (fixed in: {fixed})")
        return 1, lines
    if deps and not audited:
        reason = deps[0].get("skip_reason", "")
        return 3, [f"audit: nothing audited, the vulnerability data is unreachable here: {reason}"]
    return 0, [f"audit: {len(audited)} locked packages, no advisory but those ignored"]


if __name__ == "__main__":
    sys.exit(main())
