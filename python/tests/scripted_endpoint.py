"""A scripted OpenAI-compatible chat-completions endpoint on loopback: the model stand-in
of the harness tests (everything else in them is real).

    python3 scripted_endpoint.py SCRIPT.json      # prints "PORT" on its first line

SCRIPT.json is an object:
- `steps`: the assistant's turns, in order; each is `{"command": "..."}` (answered as a
  `bash` tool call, the way mini-swe-agent's tool-calling models act) or
  `{"content": "..."}` (plain text, no tool call);
- `repeat_last` (default false): past the end, keep answering the last step;
- `fail_first` (default 0): answer the first N requests with `fail_status`;
- `fail_status` (default 503); `always_fail` (default false): answer every request so;
- `note`: the answer to a request without tools (a handoff note).

The answer to a request is chosen by how many assistant turns its conversation already
holds, so concurrent conversations and retried trials each get the script from its
start. Every request is appended to `requests.jsonl` next to the script (turn index and
status), for tests to assert on.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Script:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.spec = json.loads(path.read_text())
        self.log = path.with_name("requests.jsonl")
        self.count = 0
        self.lock = threading.Lock()

    def answer(self, request: dict) -> tuple[int, dict]:
        with self.lock:
            self.count += 1
            n = self.count
        turn = sum(1 for m in request.get("messages", []) if m.get("role") == "assistant")
        status = 200
        if self.spec.get("always_fail") or n <= int(self.spec.get("fail_first", 0)):
            status = int(self.spec.get("fail_status", 503))
        with self.lock, self.log.open("a") as f:
            f.write(json.dumps({"request": n, "turn": turn, "status": status}) + "\n")
        if status != 200:
            return status, {"error": {"message": "scripted failure", "type": "server_error", "code": status}}
        if not request.get("tools") and "note" in self.spec:
            # A tool-free request (a handoff note): answered with the script's `note`.
            return 200, self._completion(n, request, {"role": "assistant", "content": self.spec.get("note", "")}, "stop")
        steps = self.spec["steps"]
        if turn >= len(steps):
            if not self.spec.get("repeat_last"):
                return 400, {"error": {"message": f"script has no turn {turn}", "type": "invalid_request_error"}}
            turn = len(steps) - 1
        step = steps[turn]
        message: dict = {"role": "assistant", "content": step.get("content", f"Step {turn}.")}
        finish = "stop"
        if "command" in step:
            message["tool_calls"] = [
                {
                    "id": f"call_{n}_{turn}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": step["command"]})},
                }
            ]
            finish = "tool_calls"
        return 200, self._completion(n, request, message, finish)

    def _completion(self, n: int, request: dict, message: dict, finish: str) -> dict:
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", "scripted"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        }


def serve(script_path: Path) -> None:
    script = Script(script_path)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                status, answer = 404, {"error": {"message": f"no route {self.path}"}}
            else:
                status, answer = script.answer(body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
