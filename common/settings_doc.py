"""docs/configuration.md, rendered from the settings model (common/settings.py).

`python -m common.settings_doc > docs/configuration.md` regenerates it; a unit test
(tests/unit/test_settings_doc.py) fails when the file and the model differ. The output depends on
nothing but the model: the table follows the model's field order, and the pass-through examples
are run through the same code that reads the environment.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from common.settings import (
    _SECRET_MARKERS,
    ENV_PREFIX,
    KAFKA_PASSTHROUGH_PREFIX,
    Settings,
    _passthrough,
    env_name,
)

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
REGENERATE = ".venv/bin/python -m common.settings_doc > docs/configuration.md"

# the field that holds the RANKSTREAM_KAFKA_<KEY> pass-through: its own section, not a table row
PASSTHROUGH_FIELD = "kafka"

_TYPE_NAMES: dict[type, str] = {
    bool: "`true` / `false`",
    int: "integer",
    float: "number",
    str: "string",
    SecretStr: "string (secret)",
    Path: "file path",
}

_UNITS_S = ((86_400, "day"), (3_600, "hour"), (60, "minute"))

# (variable, value) pairs shown in the pass-through section
_SASL_EXAMPLE = (
    ("RANKSTREAM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
    ("RANKSTREAM_KAFKA_SASL_MECHANISMS", "SCRAM-SHA-512"),
    ("RANKSTREAM_KAFKA_SASL_USERNAME", "rankstream"),
    ("RANKSTREAM_KAFKA_SASL_PASSWORD", "<password>"),
)
_TLS_EXAMPLE = (
    ("RANKSTREAM_KAFKA_SECURITY_PROTOCOL", "SSL"),
    ("RANKSTREAM_KAFKA_SSL_CA_LOCATION", "/etc/kafka/ca.pem"),
    ("RANKSTREAM_KAFKA_SSL_CERTIFICATE_LOCATION", "/etc/kafka/client.pem"),
    ("RANKSTREAM_KAFKA_SSL_KEY_LOCATION", "/etc/kafka/client.key"),
    ("RANKSTREAM_KAFKA_SSL_KEY_PASSWORD", "<key password>"),
)
_PEM_EXAMPLE = (("RANKSTREAM_KAFKA_SSL_KEY_PEM", "<PEM text>"),)


def table_fields() -> list[tuple[str, FieldInfo]]:
    """The settings of the table, in the model's order."""
    return [(name, info) for name, info in Settings.model_fields.items() if name != PASSTHROUGH_FIELD]


def _cell(text: str) -> str:
    """One Markdown table cell: a single line, pipes escaped."""
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def _reading(name: str, value: object) -> str:
    """For a setting in seconds or milliseconds, a readable length after the number:
    ` (7 days)`; else ``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    per_s = 1 if name.endswith("_s") else 1000 if name.endswith("_ms") else 0
    if not per_s:
        return ""
    for size_s, unit in _UNITS_S:
        size = size_s * per_s
        if value >= size and value % size == 0:
            count = int(value // size)
            return f" ({count} {unit}{'' if count == 1 else 's'})"
    return ""


def _base_type(annotation: Any) -> Any:
    """`Path | None` -> Path: the type a value must have when it is set."""
    if get_origin(annotation) in (Union, types.UnionType):
        (inner,) = [arg for arg in get_args(annotation) if arg is not type(None)]
        return inner
    return annotation


def default_text(name: str, info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "(unset)"
    if isinstance(value, SecretStr):
        value = value.get_secret_value()  # a default is no credential: it names the local stack
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "(empty)"
    return f"`{value}`{_reading(name, value)}"


def allowed_text(name: str, info: FieldInfo) -> str:
    """What a value must be: the field's own note, else its type and the Field constraints."""
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("allowed"), str):
        return str(extra["allowed"])
    base = _base_type(info.annotation)
    kind = _TYPE_NAMES.get(base, getattr(base, "__name__", str(base)))
    bounds: dict[str, object] = {}
    pattern = None
    for item in info.metadata:
        if isinstance(item, Ge | Gt | Le | Lt):
            (op,) = (attr for attr in ("ge", "gt", "le", "lt") if hasattr(item, attr))
            bounds[op] = getattr(item, op)
        elif isinstance(getattr(item, "pattern", None), str):
            pattern = f"matching `{item.pattern}`"
    text = {op: f"{value}{_reading(name, value)}" for op, value in bounds.items()}
    if "ge" in text and "le" in text:
        parts = [f"from {text['ge']} to {text['le']}"]
    else:
        words = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}
        parts = [f"{words[op]} {text[op]}" for op in ("ge", "gt", "le", "lt") if op in text]
    parts += [pattern] if pattern else []
    return " ".join([kind, ", ".join(parts)]) if parts else kind


def _secret_fields() -> list[str]:
    return [env_name(name) for name, info in table_fields() if _base_type(info.annotation) is SecretStr]


def _passthrough_rows(example: tuple[tuple[str, str], ...]) -> list[str]:
    rows = []
    for variable, value in example:
        ((key, read),) = _passthrough({variable: value}).items()
        secret = "yes" if isinstance(read, SecretStr) else "no"
        rows.append(f"| `{variable}={value}` | `{key}` | {secret} |")
    return rows


def _passthrough_table(example: tuple[tuple[str, str], ...]) -> list[str]:
    return [
        "| variable | librdkafka key | kept secret |",
        "|---|---|---|",
        *_passthrough_rows(example),
    ]


def _settings_named_like_passthrough() -> list[str]:
    return [
        f"`{env_name(name)}`"
        for name, _ in table_fields()
        if env_name(name).startswith(KAFKA_PASSTHROUGH_PREFIX)
    ]


def render() -> str:
    """The Markdown of docs/configuration.md."""
    secrets = ", ".join(f"`{name}`" for name in _secret_fields())
    markers = ", ".join(f"`{marker}`" for marker in _SECRET_MARKERS)
    own = ", ".join(_settings_named_like_passthrough())
    lines = [
        "<!-- Generated from the settings model: do not edit. Regenerate with",
        f"     `{REGENERATE}` -->",
        "",
        "# Configuration",
        "",
        "Every process (`rankstream worker`, `rankstream api`, the other `rankstream` commands) reads "
        "its settings from the environment when it starts: a setting's variable is `"
        + ENV_PREFIX
        + "` followed by its name in upper case (`api_port`: `"
        + env_name("api_port")
        + "`). A setting that is not set takes its default, which points at the local stack "
        "(`rankstream stack up`), but for the topics' replication (`"
        + env_name("topic_replication")
        + "`, `"
        + env_name("topic_min_insync_replicas")
        + "`), whose defaults suit a Kafka cluster of 3 or more brokers: the local stack and the "
        "tests create their topics with 1.",
        "",
        "An unknown `"
        + ENV_PREFIX
        + "*` variable is taken for a typo and refused: the command prints one line naming it "
        "(`rankstream: unknown setting RANKSTREAM_REDIS_ULR (known: ...)`) and exits with status 2. "
        "A value that is not allowed is refused the same way "
        "(`rankstream: RANKSTREAM_API_PORT: ...`). Not refused: the librdkafka pass-through "
        "`" + KAFKA_PASSTHROUGH_PREFIX + "<KEY>` (below), and `" + ENV_PREFIX + "TEST_*` variables, "
        "which belong to the test suite.",
        "",
        f"Secrets are never logged nor printed: {secrets}, and the pass-through keys named below.",
        "",
        "## Settings",
        "",
        "| variable | default | allowed | meaning |",
        "|---|---|---|---|",
    ]
    for name, info in table_fields():
        row = (
            f"`{env_name(name)}`",
            default_text(name, info),
            allowed_text(name, info),
            info.description or "",
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    lines += [
        "",
        f"## librdkafka pass-through: `{KAFKA_PASSTHROUGH_PREFIX}<KEY>`",
        "",
        f"Any other variable starting with `{KAFKA_PASSTHROUGH_PREFIX}` sets a librdkafka "
        "configuration property of the Kafka clients of every process: the rest of its name, "
        "lower-cased, with every `_` turned into `.`, is the property's key, the variable's value its "
        f"value (so a librdkafka key that contains `_` cannot be set this way). {own} "
        f"{'is a setting' if own.count('`') == 2 else 'are settings'} of the table above, not a "
        "pass-through. rankstream does not check the keys or values: librdkafka refuses an "
        "unknown key or a bad value when a client is created.",
        "",
        "A pass-through key replaces rankstream's own default for it (the worker's "
        "`session.timeout.ms` of 6 s, for example; `"
        + KAFKA_PASSTHROUGH_PREFIX
        + "BOOTSTRAP_SERVERS` would replace `"
        + env_name("kafka_bootstrap")
        + "`: set that one instead). The keys exactly-once processing depends on are always "
        "rankstream's, whatever the environment says: the worker's `group.id`, `isolation.level`, "
        "`enable.auto.commit`, `transactional.id`, `enable.idempotence` and `acks`, among others.",
        "",
        f"A key containing any of {markers} is kept secret: never logged nor printed. No other "
        "key is: a credential under another key (inside `sasl.oauthbearer.config`, say) is "
        "treated as plain text.",
        "",
        "SASL over TLS, user and password:",
        "",
        *_passthrough_table(_SASL_EXAMPLE),
        "",
        "TLS with a client certificate:",
        "",
        *_passthrough_table(_TLS_EXAMPLE),
        "",
        "The client key can be given as PEM text instead of a file:",
        "",
        *_passthrough_table(_PEM_EXAMPLE),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
