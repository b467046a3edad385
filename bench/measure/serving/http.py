"""HTTP with the standard library: JSON GETs, and POSTs whose answer streams as server-sent events (`data:` lines)."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

from bench.errors import MissingArtifactError


class ServerError(RuntimeError):
    """The server answered, but with an error status or a body that is not what the endpoint promises."""


def unreachable(url: str, err: Exception, setting: str) -> MissingArtifactError:
    """The one-line error for a server that does not answer: the url and the setting that fixes it."""
    reason = getattr(err, "reason", None) or err
    return MissingArtifactError(f"no server answers at {url} ({reason}); start it, or set {setting}=<its url> "
                                f"(or server.launch=<the command that starts it>)")


def get_text(url: str, timeout: float) -> str:
    """The body of a GET as text; raises urllib's errors (callers decide what they mean)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def post_text(url: str, body: dict, timeout: float) -> str:
    """The body of a JSON POST's answer as text (MLC-LLM's debug endpoints); raises urllib's errors."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def post_stream(url: str, body: dict, timeout: float) -> Iterator[tuple[float, dict]]:
    """(perf_counter at arrival, parsed event) for every `data:` line of a streamed POST, until `[DONE]` or the
    end of the stream. Raises ServerError on an HTTP error status, URLError where nothing answers."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace").strip()[:300]
        raise ServerError(f"{url} answered HTTP {err.code}: {detail}") from err
    with response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue  # blank separators, `event:` and `:` comment lines
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                return
            arrived = time.perf_counter()
            try:
                event = json.loads(payload)
            except json.JSONDecodeError as err:
                raise ServerError(f"{url} streamed a line that is not JSON: {payload[:200]}") from err
            if "error" in event:
                raise ServerError(f"{url} streamed an error: {json.dumps(event['error'])[:300]}")
            yield arrived, event
