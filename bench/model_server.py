"""A fast fake OpenAI-compatible model server for the benchmarks (asyncio, one process).

Every chat completion is answered after `--latency` seconds: streamed in `--pieces` pieces (the
first after half the latency, the rest spread over the other half), or whole. It counts the
requests it has in flight and the most it ever had; `GET /stats` answers them as JSON and
`POST /reset` zeroes them. With `--rate N` it refuses, as providers do, a request beyond N started
in the last second (429 with `Retry-After: 1`); it counts the refusals and the most requests it
started in any one second.

    .venv/bin/python bench/model_server.py --port 8790 --latency 2 --pieces 20 --rate 50
"""

import argparse
import asyncio
import collections
import json
import time

USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


class Stats:
    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.served = 0
        self.refused = 0
        self.busiest_second = 0
        self.started: collections.deque[float] = collections.deque()
        self.marks: dict[str, float] = {}  # a marked question ("mark:…"): when it first arrived
        self.reset_at = time.monotonic()
        self.seconds: collections.Counter[tuple[int, bool]] = collections.Counter()

    def admit(self, rate: int) -> bool:
        """Whether a request may start now under `rate` a second (0: any), counting it if so."""
        now = time.monotonic()
        while self.started and self.started[0] <= now - 1:
            self.started.popleft()
        second = int(now - self.reset_at)
        if rate and len(self.started) >= rate:
            self.refused += 1
            self.seconds[second, False] += 1
            return False
        self.seconds[second, True] += 1
        self.started.append(now)
        self.busiest_second = max(self.busiest_second, len(self.started))
        return True

    def reset(self) -> None:
        self.peak, self.served, self.refused, self.busiest_second = self.in_flight, 0, 0, 0
        self.started.clear()
        self.marks.clear()
        self.reset_at = time.monotonic()
        self.seconds.clear()

    def as_json(self) -> bytes:
        return json.dumps(
            {
                "inFlight": self.in_flight,
                "peak": self.peak,
                "served": self.served,
                "refused": self.refused,
                "busiestSecond": self.busiest_second,
                "marks": self.marks,
                # Each second since the reset: [requests started, requests refused].
                "timeline": [
                    [self.seconds[s, True], self.seconds[s, False]]
                    for s in range(max((s for s, _ in self.seconds), default=-1) + 1)
                ],
            }
        ).encode()


def _chunk(content: str | None = None, usage: dict | None = None) -> bytes:
    body: dict = {"choices": [] if usage else [{"index": 0, "delta": {"content": content}}]}
    if usage:
        body["usage"] = usage
    data = b"data: " + json.dumps(body).encode() + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return method, path, body


async def _answer(writer, stats: Stats, body: bytes, latency: float, pieces: int) -> None:
    request = json.loads(body or b"{}")
    questions = [m.get("content") for m in request.get("messages", []) if m.get("role") == "user"]
    if questions and isinstance(questions[0], str) and questions[0].startswith("mark:"):
        stats.marks.setdefault(questions[0], time.time())  # the wall clock: the bench compares
    stats.in_flight += 1
    stats.peak = max(stats.peak, stats.in_flight)
    try:
        if request.get("stream"):
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            await asyncio.sleep(latency / 2)
            gap = (latency / 2) / max(pieces - 1, 1)
            for i in range(pieces):
                if i:
                    await asyncio.sleep(gap)
                writer.write(_chunk(f"w{i} "))
                await writer.drain()
            writer.write(_chunk(usage=USAGE))
            done = b"data: [DONE]\n\n"
            writer.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
        else:
            await asyncio.sleep(latency)
            text = "".join(f"w{i} " for i in range(pieces))
            reply = {
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
                "usage": USAGE,
            }
            _respond(writer, 200, json.dumps(reply).encode())
        await writer.drain()
    finally:
        stats.in_flight -= 1
        stats.served += 1


def _respond(writer, status: int, body: bytes, headers: str = "") -> None:
    writer.write(
        f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n{headers}"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


LIMITED = json.dumps({"error": {"message": "Rate limit reached", "type": "requests"}}).encode()


async def main(port: int, latency: float, pieces: int, rate: int) -> None:
    stats = Stats()

    async def serve(reader, writer):
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                method, path, body = request
                if method == "GET" and path == "/stats":
                    _respond(writer, 200, stats.as_json())
                elif method == "POST" and path == "/reset":
                    stats.reset()
                    _respond(writer, 200, stats.as_json())
                elif not stats.admit(rate):
                    _respond(writer, 429, LIMITED, "Retry-After: 1\r\n")
                else:
                    await _answer(writer, stats, body, latency, pieces)
                await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=4096)
    print(f"listening on {port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--pieces", type=int, default=20)
    parser.add_argument("--rate", type=int, default=0, help="requests a second (0: no limit)")
    args = parser.parse_args()
    asyncio.run(main(args.port, args.latency, args.pieces, args.rate))
