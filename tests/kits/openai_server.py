"""A real HTTP server on 127.0.0.1 that speaks just enough of the OpenAI chat API for tests.

It replays a script, one entry per request to POST /v1/chat/completions (or
/chat/completions):

- a dict: the model's answer; serialised as JSON into choices[0].message.content of a
  proper chat.completion (id, model, usage tokens);
- an int: that HTTP status with an OpenAI-style error body (429 carries Retry-After: 0);
- "hang": the request is held longer than any client time-out (`hang_s`), then closed;
- any other str: that text as the message content (a model answering prose/garbage);
- a `Reply`: full control (status, raw body, headers, content, usage, delay).

When the script runs out, every further request gets HTTP 500 "script exhausted": the
server never loops. Received requests (parsed JSON bodies, paths, headers) are recorded for
assertions. `stop()` wakes hanging handlers and shuts the server down; use it as a context
manager or a pytest fixture.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass
class Reply:
    status: int = 200
    content: str | None = None  # message content of a chat.completion (when body is None)
    body: str | bytes | None = None  # raw HTTP body, sent as is
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict | None = None
    delay_s: float = 0.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict | None
    raw: bytes

    @property
    def messages(self) -> list[dict]:
        return (self.body or {}).get("messages", [])

    @property
    def text(self) -> str:
        return "\n".join(str(m.get("content", "")) for m in self.messages)


class FakeOpenAIServer:
    def __init__(self, script: list | None = None, *, model: str = "fake-model", hang_s: float = 10.0,
                 usage: dict | None = None):
        self.script = list(script or [])
        self.model = model
        self.hang_s = hang_s
        self.usage = usage or {"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160}
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        self._next = 0
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------- control ----
    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def remaining(self) -> int:
        return len(self.script) - self._next

    def push(self, *entries) -> None:
        with self._lock:
            self.script.extend(entries)

    def start(self) -> "FakeOpenAIServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                self._send(404, {"error": {"message": "only POST /v1/chat/completions", "type": "not_found"}})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"null")
                except json.JSONDecodeError:
                    body = None
                path = self.path.split("?")[0]
                with server._lock:
                    server.requests.append(Received(path, {k.lower(): v for k, v in self.headers.items()}, body, raw))
                if path not in PATHS:
                    return self._send(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
                entry = server._take()
                server._answer(self, entry, body)

            def _send(self, status, payload, headers=None, content_type="application/json"):
                data = payload if isinstance(payload, bytes) else (
                    payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (time-out): nothing to send to

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------- replies ----
    def _take(self):
        with self._lock:
            if self._next >= len(self.script):
                return Reply(status=500, body=json.dumps({"error": {"message": "script exhausted",
                                                                    "type": "server_error"}}))
            entry = self.script[self._next]
            self._next += 1
            return entry

    def completion(self, content: str, usage: dict | None = None) -> dict:
        return {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": self.model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": dict(usage or self.usage),
        }

    def _answer(self, h, entry, body) -> None:
        if isinstance(entry, dict):
            entry = Reply(content=json.dumps(entry))
        elif isinstance(entry, int):
            headers = {"Retry-After": "0"} if entry == 429 else {}
            kind = "rate_limit_exceeded" if entry == 429 else "server_error" if entry >= 500 else "invalid_request"
            entry = Reply(status=entry, headers=headers,
                          body=json.dumps({"error": {"message": f"scripted {entry}", "type": kind, "code": kind}}))
        elif entry == "hang":
            self._stopping.wait(self.hang_s)  # stop() wakes it
            h.close_connection = True
            return
        elif isinstance(entry, str):
            entry = Reply(content=entry)
        if entry.delay_s:
            self._stopping.wait(entry.delay_s)
        if entry.body is not None:
            payload = entry.body
        else:
            payload = self.completion(entry.content or "", entry.usage)
        h._send(entry.status, payload, entry.headers, entry.content_type)
