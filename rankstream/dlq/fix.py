"""`--fix-with FILE.py`: a Python file that defines `fix(event: dict) -> dict | None`, run on each
selected dead letter's event before it is produced again. None: leave this one out.

The file is the operator's own code, run as it is. What goes wrong is said in one line: a file
that can't be loaded stops the command before anything is read (exit 2); a fix that raises, or
returns something other than a dict or None, refuses that dead letter alone."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankstream.admin import UsageError
from rankstream.dlq.records import Unreplayable

Fix = Callable[[dict[str, Any]], object]


def load_fix(path: Path) -> Fix:
    """The file's `fix` function; UsageError (one line) if there is none to call."""
    where = f"--fix-with {path}"
    if not path.is_file():
        raise UsageError(f"{where}: no such file")
    spec = importlib.util.spec_from_file_location("rankstream_dlq_fix", path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{where}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise UsageError(f"{where}: line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - the operator's code: whatever it raises is said in one line
        raise UsageError(f"{where}: loading it raised {type(exc).__name__}: {exc}") from None
    fix = getattr(module, "fix", None)
    if not callable(fix):
        raise UsageError(f"{where}: defines no function fix(event: dict) -> dict | None")
    checked: Fix = fix
    return checked


def apply_fix(fix: Fix, event: dict[str, Any]) -> dict[str, Any] | None:
    """The fixed event (None: the fix leaves it out); Unreplayable when the fix raises or returns
    something that is not an event. The fix gets a copy: it may change it in place."""
    try:
        fixed = fix(copy.deepcopy(event))
    except Exception as exc:  # noqa: BLE001 - the operator's code: said in one line, the others go on
        raise Unreplayable(f"the fix raised {type(exc).__name__}: {exc}") from None
    if fixed is None or isinstance(fixed, dict):
        return fixed
    raise Unreplayable(f"the fix returned {type(fixed).__name__}, not an event (a dict) or None")
