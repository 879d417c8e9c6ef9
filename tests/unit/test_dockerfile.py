"""deploy/Dockerfile, read as text (no Docker engine needed): two stages, the final one made of
the first's wheels only, no build tools in it, an unprivileged numeric user, and the ports and
board file the settings name."""

from __future__ import annotations

import re
from pathlib import Path

from common.settings import Settings

DOCKERFILE = Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile"
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|make|build-essential|clang|cargo|rustc|git|apt-get install|apk add)\b"
)


def stages() -> list[list[str]]:
    """The instructions of each stage (comments and blank lines left out, continuations joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found: list[list[str]] = []
    for line in (raw.strip() for raw in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            found.append([])
        found[-1].append(line)
    return found


def test_the_image_is_built_in_stages_and_the_last_holds_the_wheels_only():
    build, final = stages()[0], stages()[-1]
    assert len(stages()) >= 2
    assert build[0].endswith(" AS build") and any("pip wheel" in line for line in build)
    assert not any(line.upper().startswith(("COPY COMMON", "COPY WORKER", "COPY API ")) for line in final)
    installs = [line for line in final if "pip install" in line]
    assert installs and all("from=build" in line and "/wheels" in line for line in installs)
    assert all("--no-cache-dir" in line for line in installs)


def test_the_final_stage_installs_no_build_tools():
    final = stages()[-1]
    assert [line for line in final if line.upper().startswith("RUN") and BUILD_TOOLS.search(line)] == []
    base = final[0].split()[1]
    assert base.endswith("-slim"), base  # a base image without compilers


def test_the_processes_run_as_an_unprivileged_numeric_user():
    users = [line.split()[1] for line in stages()[-1] if line.upper().startswith("USER ")]
    assert users, "the final stage sets USER"
    uid, _, gid = users[-1].partition(":")
    # numeric: Kubernetes' runAsNonRoot can only check a numeric user
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))


def test_the_ports_and_the_board_file_are_the_settings():
    final = stages()[-1]
    exposed = {int(p) for line in final if line.upper().startswith("EXPOSE ") for p in line.split()[1:]}
    fields = Settings.model_fields
    assert exposed == {
        fields["api_port"].default,
        fields["worker_http_port"].default,
        fields["api_admin_port"].default,
    }
    env = " ".join(line for line in final if line.upper().startswith("ENV "))
    board_file = re.search(r"RANKSTREAM_BOARDS=(\S+)", env)
    assert board_file is not None
    assert any(line.startswith("COPY ") and line.endswith(board_file[1]) for line in final)
    assert f"`{board_file[1]}`" in (fields["boards"].description or "")
    assert final[-2:] == ['ENTRYPOINT ["rankstream"]', 'CMD ["api"]']
