"""kustomize, pinned and built from the Go module proxy on first use (`go install`, ~1 min; then
cached in the user cache), to render deploy/k8s's base and overlays in the suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from rankstream.stack import cache_dir

VERSION = "v5.7.1"
MODULE = "sigs.k8s.io/kustomize/kustomize/v5"
DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "k8s"


@cache
def kustomize() -> str:
    binary = cache_dir() / f"kustomize-{VERSION}" / "kustomize"
    if binary.exists():
        return str(binary)
    go = shutil.which("go")
    if go is None:
        pytest.fail("install Go to build kustomize, which renders deploy/k8s in the suite", pytrace=False)
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=binary.parent) as staging:  # whole or absent
        done = subprocess.run(
            [go, "install", f"{MODULE}@{VERSION}"],
            env={**os.environ, "GOBIN": staging, "GOFLAGS": "-mod=mod"},
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"go install {MODULE}@{VERSION} failed: {done.stderr.strip()[-500:]}", pytrace=False)
        os.replace(Path(staging) / "kustomize", binary)
    return str(binary)


@cache
def render(folder: str) -> tuple[dict[str, Any], ...]:
    """`kustomize build deploy/k8s/<folder>`: its documents."""
    done = subprocess.run(
        [kustomize(), "build", str(DEPLOY / folder)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)
