"""A callback receiver on loopback that records every request it gets."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """Answer `status` (200 by default), optionally after `delay` seconds or with a redirect."""

    def __init__(self):
        self.requests: list[dict] = []
        self.status = 200
        self.delay = 0.0
        self.location = None
        self.in_flight = 0  # requests received and not yet answered
        self.most_in_flight = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.requests.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "raw": body,
                            "json": _json(body),
                            "at": time.monotonic(),
                        }
                    )
                    receiver.in_flight += 1
                    receiver.most_in_flight = max(receiver.most_in_flight, receiver.in_flight)
                try:
                    if receiver.delay:
                        time.sleep(receiver.delay)
                finally:
                    with receiver._lock:
                        receiver.in_flight -= 1
                self.send_response(receiver.status)
                if receiver.location:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/cb"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict]:
        with self._lock:
            return [r["json"] for r in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _json(body: bytes):
    try:
        return json.loads(body)
    except ValueError:
        return None
