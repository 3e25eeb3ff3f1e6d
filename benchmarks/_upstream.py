"""A fast canned upstream on a raw asyncio protocol, answering like vLLM: as cheap as Python serving gets, so the
router's cost is what the benchmark sees.

    python -m benchmarks._upstream PORT [--gap-ms 0] [--first-ms 0]

`POST .../chat/completions` answers a fixed completion, or, when the body asks `"stream": true`, an SSE stream of 5
chunks (and the usage chunk when asked: `stream_options.include_usage`) and [DONE], the first at once and the rest
`--gap-ms` apart (chunked encoding). `POST .../responses` (the OpenAI Responses API) and `POST .../messages` (the
Anthropic Messages API) answer the same text in their own shapes (benchmarks/_answers.py), streamed in their own
events in as many chunks as chat's, so that rows compare like for like. Any other path answers as chat.
`--first-ms`: every answer (its head, plain or streamed) waits that long first, a model's time to first token
(benchmarks/overlap.py). Keep-alive, HTTP/1.1 only, loopback only.
"""

from __future__ import annotations

import argparse
import asyncio

from benchmarks._answers import ANSWERS, CHAT_USAGE_CHUNK


def _plain(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
# By the path's last segments: the plain answer (head and body) and the stream's chunks.
REPLIES = {suffix: (_plain(body), chunks) for suffix, (body, chunks) in ANSWERS.items()}


def _reply(head: bytes) -> tuple[bytes, list[bytes]]:
    path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
    for suffix, reply in REPLIES.items():
        if path.endswith(suffix):
            return reply
    return REPLIES[b"/chat/completions"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Protocol(asyncio.Protocol):
    def __init__(self, gap_s: float, first_s: float = 0.0) -> None:
        self.gap_s, self.first_s = gap_s, first_s
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
            plain, chunks = _reply(head)
            compact = body.replace(b" ", b"")
            if b'"stream":true' in compact:
                if b'"include_usage":true' in compact and chunks[-1] == b"data: [DONE]\n\n":  # chat's usage chunk
                    chunks = [*chunks[:-1], CHAT_USAGE_CHUNK, chunks[-1]]
                self.busy = True
                self.task = asyncio.ensure_future(self._stream(chunks))
                return
            if self.first_s:
                self.busy = True
                self.task = asyncio.ensure_future(self._later(plain))
                return
            assert self.transport is not None
            self.transport.write(plain)

    async def _later(self, plain: bytes) -> None:
        await asyncio.sleep(self.first_s)
        assert self.transport is not None
        if not self.transport.is_closing():
            self.transport.write(plain)
        self.busy = False
        self._serve()

    async def _stream(self, chunks: list[bytes]) -> None:
        assert self.transport is not None
        if self.first_s:
            await asyncio.sleep(self.first_s)
            if self.transport.is_closing():
                return
        self.transport.write(STREAM_HEAD)
        for index, data in enumerate(chunks):
            if self.gap_s and index:  # the first chunk at once, then one every gap
                await asyncio.sleep(self.gap_s)
            if self.transport.is_closing():
                return
            self.transport.write(_chunk(data))
        self.transport.write(b"0\r\n\r\n")
        self.busy = False
        self._serve()


async def main(port: int, gap_s: float, first_s: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Protocol(gap_s, first_s), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    parser.add_argument("--first-ms", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(main(args.port, args.gap_ms / 1000, args.first_ms / 1000))
