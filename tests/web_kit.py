"""Helpers for the web example's tests: load the app, run it under uvicorn, parse SSE."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "examples" / "web"
CHROMIUM = Path("/usr/bin/chromium")


def load_app_module() -> ModuleType:
    """examples/web/app.py as a module (it is not a package)."""
    spec = importlib.util.spec_from_file_location("steerable_web_example", WEB / "app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # FastAPI resolves the app's annotations through it
    spec.loader.exec_module(module)
    return module


def parse_sse(text: str) -> list[dict[str, Any]]:
    """The events of an SSE body (keep-alive comments skipped), checked frame by frame."""
    events = []
    for frame in text.split("\n\n"):
        lines = [line for line in frame.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        fields = dict(line.split(": ", 1) for line in lines)
        body = json.loads(fields["data"])
        assert fields["id"] == str(body["seq"]), frame
        assert fields["event"] == body["kind"], frame
        events.append(body)
    return events


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def uvicorn_app(tmp_path: Path, **env: str) -> Iterator[str]:
    """The example app in a real uvicorn process on a loopback port; yields its base URL.

    Waits for uvicorn's own "running" line (no polling); on exit sends SIGINT (the app's
    lifespan shuts the runtime down) and checks the process exited cleanly.
    """
    port = free_port()
    log = tmp_path / "uvicorn.log"
    environ = {**os.environ, "STEERABLE_WEB_DB": str(tmp_path / "web.db"), **env}
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                str(WEB),
                "app:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "info",
                "--no-access-log",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=environ,
            cwd=tmp_path,
        )
        assert proc.stderr is not None
        try:
            for line in proc.stderr:
                sink.write(line)
                if "Uvicorn running on" in line:
                    break
            else:
                raise AssertionError(f"uvicorn did not start: {log.read_text()}")
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.send_signal(signal.SIGINT)
            _, rest = proc.communicate(timeout=60)
            sink.write(rest or "")
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "Traceback" not in text, text
