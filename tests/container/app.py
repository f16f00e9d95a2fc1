"""A stand-in for the app beside leaderd in the container tests: it serves
its readiness on /ready and, on /seen, what it sees of leaderd from inside
its own container: the flag file on the shared volume and /leader on
localhost (LEADER_URL)."""

import json
import os
import signal
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ.get("APP_PORT", "8080"))
LEADER_URL = os.environ.get("LEADER_URL", "http://127.0.0.1:4040/leader")
FLAG_FILE = os.environ.get("LEADER_FLAG_FILE", "/run/leader/leader.json")


def leader():
    try:
        with urllib.request.urlopen(LEADER_URL, timeout=2) as r:
            return {"status": r.status, "body": json.load(r)}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": json.load(e)}
    except OSError as e:
        return {"status": None, "error": str(e)}


def flag():
    try:
        with open(FLAG_FILE) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/ready":
            body = b"ready\n"
        elif self.path == "/seen":
            body = json.dumps({"flag": flag(), "leader": leader()}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


# PID 1 of its container: without a handler, SIGTERM would be ignored and
# every pod stop would wait out the grace period.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
