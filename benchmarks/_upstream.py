"""A fast canned OpenAI-compatible upstream on a raw asyncio protocol: as cheap as Python serving gets, so the
router's cost is what the benchmark sees.

    python -m benchmarks._upstream PORT [--gap-ms 0]

`POST .../chat/completions` answers a fixed completion, or, when the body asks `"stream": true`, an SSE stream of
5 chunks and [DONE], the first at once and the rest `--gap-ms` apart (chunked encoding). Keep-alive, HTTP/1.1
only, loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json

COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}).encode()  # fmt: skip
PLAIN = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(COMPLETION)).encode()
    + b"\r\n\r\n"
    + COMPLETION
)
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
CHUNKS = [
    b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i
    for i in range(5)
] + [b"data: [DONE]\n\n"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Protocol(asyncio.Protocol):
    def __init__(self, gap_s: float) -> None:
        self.gap_s = gap_s
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.task: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._serve()

    def _serve(self) -> None:
        while not self.busy:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            marker = head.find(b"content-length:")
            if marker >= 0:
                length = int(head[marker + 15 :].split(b"\r\n", 1)[0])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            if b'"stream":true' in body.replace(b" ", b""):
                self.busy = True
                self.task = asyncio.ensure_future(self._stream())
                return
            assert self.transport is not None
            self.transport.write(PLAIN)

    async def _stream(self) -> None:
        assert self.transport is not None
        self.transport.write(STREAM_HEAD)
        for index, data in enumerate(CHUNKS):
            if self.gap_s and index:  # the first chunk at once, then one every gap
                await asyncio.sleep(self.gap_s)
            if self.transport.is_closing():
                return
            self.transport.write(_chunk(data))
        self.transport.write(b"0\r\n\r\n")
        self.busy = False
        self._serve()


async def main(port: int, gap_s: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Protocol(gap_s), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(main(args.port, args.gap_ms / 1000))
