"""Test hosts of the pull tests, on loopback only. One JSON line per request goes to LOG.

  token ROOT PORTFILE LOG
      /token answers a bearer token (any credentials); every other path is a file
      under ROOT: the target of a registry's redirect middleware (its storage root).
  proxy UPSTREAM_PORT FAULTS PORTFILE LOG
      forwards to a registry on 127.0.0.1:UPSTREAM_PORT, with FAULTS (comma-separated):
        cut          the first GET of each blob without a Range sends half its body, then
                     closes the connection
        ignore-range Range headers are not passed on (the registry answers 200, whole)
        429          the first manifest request is answered 429 with Retry-After: 1
        slow         blob bodies go out 64 KiB at a time, 50 ms apart

The port it listens on is written to PORTFILE once it listens.
"""

import http.client
import http.server
import json
import os
import sys
import threading
import time

LOCK = threading.Lock()


def record(log, entry):
    with LOCK, open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")


def token_server(root, log):
    count = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            record(log, {"method": "GET", "path": self.path, "auth": self.headers.get("Authorization")})
            if self.path.startswith("/token"):
                with LOCK:
                    count[0] += 1
                    n = count[0]
                body = json.dumps({"token": "tok-%d" % n, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
            else:
                path = os.path.realpath(os.path.join(root, self.path.split("?")[0].lstrip("/")))
                if not path.startswith(os.path.realpath(root) + os.sep) or not os.path.isfile(path):
                    self.send_error(404)
                    return
                with open(path, "rb") as f:
                    body = f.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def proxy(upstream, faults, log):
    seen_blobs = set()
    answered_429 = [False]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def forward(self, method):
            entry = {"method": method, "path": self.path, "range": self.headers.get("Range")}
            is_blob = "/blobs/sha256:" in self.path
            if "429" in faults and "/manifests/" in self.path and not answered_429[0]:
                answered_429[0] = True
                entry["fault"] = "429"
                record(log, entry)
                self.send_response(429)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            dropped = ("host", "connection") + (("range",) if "ignore-range" in faults else ())
            headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=60)
            conn.request(method, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            cut = False
            if is_blob and method == "GET" and resp.status == 200 and "cut" in faults:
                with LOCK:
                    cut = self.path not in seen_blobs
                    seen_blobs.add(self.path)
            entry["status"] = resp.status
            if cut:
                entry["fault"] = "cut"
            record(log, entry)
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("connection", "transfer-encoding", "date", "server"):
                    self.send_header(k, v)
            self.end_headers()
            if method == "HEAD":
                return
            total = int(resp.getheader("Content-Length") or 0)
            sent = 0
            while True:
                chunk = resp.read(65536)
                if not chunk:
                    break
                if cut and sent + len(chunk) > total // 2:
                    self.wfile.write(chunk[: total // 2 - sent])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(chunk)
                sent += len(chunk)
                if "slow" in faults and is_blob:
                    self.wfile.flush()
                    time.sleep(0.05)

        def do_GET(self):
            self.forward("GET")

        def do_HEAD(self):
            self.forward("HEAD")

    return Handler


def main():
    mode = sys.argv[1]
    if mode == "token":
        root, portfile, log = sys.argv[2:5]
        handler = token_server(root, log)
    elif mode == "proxy":
        upstream, faults, portfile, log = sys.argv[2:6]
        handler = proxy(int(upstream), faults.split(","), log)
    else:
        sys.exit("unknown mode " + mode)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(portfile + ".tmp", portfile)
    server.serve_forever()


if __name__ == "__main__":
    main()
