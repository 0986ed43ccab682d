"""A local stand-in for the OpenAI and Anthropic HTTP APIs (the edge of the world), so the real
`openai` and `anthropic` SDKs, and the instrumentations that wrap them, run unchanged in tests.

It answers `POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic) like a weather
agent's model: asked with tools and no tool result yet, it asks for `get_weather(city=Paris)`;
otherwise it answers in text. Asked to `stream`, OpenAI's answer comes as server-sent chunks, with a
last chunk of usage only when `stream_options.include_usage` asks for it (as the service does:
without it a stream reports no usage at all). OpenAI's reply names a dated model (`gpt-4o-2024-08-06`), as the real service does;
Anthropic's the model asked. Asked for `n` choices, it gives that many (the later ones' text marked `(candidate i)`). Set `report_usage` to False and `usage` is left out of every answer (as some
OpenAI-compatible servers do). `answer` changes the final text (a
non-deterministic model: a restarted agent gets another answer); `requests` keeps every body.
Set `fail` to `"http-500"` and every call is answered HTTP 500 with an error body, to `"hang-up"`
and the connection is closed once the request is read, with no answer (a provider that went away);
`fail_times` fails only that many requests (then answers as usual; None: every one).
Run it in a thread (`start()`) or as a process (`python tests/fake_providers.py PORT`).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OPENAI_MODEL = "gpt-4o-2024-08-06"
ANTHROPIC_MODEL = "claude-3-5-sonnet-20241022"


class FakeProviders(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, port: int = 0, answer: str = "21 °C and sunny in Paris.", say_while_asking: bool = False
    ) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.answer = answer
        self.say_while_asking = say_while_asking  # a text beside the tool call, from `answer` too
        self.requests: list[dict[str, Any]] = []
        self.report_usage = True
        self.fail: str | None = None  # "http-500" or "hang-up": see the module's docstring
        self.fail_times: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> FakeProviders:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def _asked_for_tool(messages: list[dict[str, Any]], tools: Any) -> bool:
    """Tools offered and no tool result in the conversation yet."""
    if not tools:
        return False
    for message in messages:
        if message.get("role") == "tool":
            return False
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content):
            return False
    return True


def openai_reply(body: dict[str, Any], answer: str, say_while_asking: bool = False) -> dict[str, Any]:
    if _asked_for_tool(body.get("messages", []), body.get("tools")):
        message: dict[str, Any] = {
            "role": "assistant",
            "content": f"Looking it up ({answer})" if say_while_asking else None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        }
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": answer}, "stop"
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": OPENAI_MODEL,
        # `n` choices: the second and later answer in other words (a best-of-n agent's candidates).
        "choices": [
            {
                "index": i,
                "message": {**message, "content": f"{answer} (candidate {i + 1})"}
                if i and finish == "stop"
                else message,
                "finish_reason": finish,
            }
            for i in range(body.get("n") or 1)
        ],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 20},
        },
    }


def openai_chunks(reply: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """`reply` (a chat completion) as the chunks of its stream: the role, the text or each tool
    call's name then its arguments, the finish reason; then, asked for, the usage alone (no choices),
    every chunk before it carrying `usage: null`."""
    message, finish = reply["choices"][0]["message"], reply["choices"][0]["finish_reason"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": function["name"], "arguments": ""},
                    }
                ]
            }
        )
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]})
    head = {key: reply[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas] + [
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    ]
    if include_usage:
        chunks = [{**chunk, "usage": None} for chunk in chunks] + [{**head, "choices": [], "usage": reply["usage"]}]
    return chunks


def anthropic_reply(body: dict[str, Any], answer: str) -> dict[str, Any]:
    if _asked_for_tool(body.get("messages", []), body.get("tools")):
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
        ]
        stop = "tool_use"
    else:
        content, stop = [{"type": "text", "text": answer}], "end_turn"
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or ANTHROPIC_MODEL,  # Anthropic answers with the model as asked
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 100,
            "output_tokens": 30,
            "cache_read_input_tokens": 20,
            "cache_creation_input_tokens": 0,
        },
    }


class _Handler(BaseHTTPRequestHandler):
    server: FakeProviders

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, **body})
        fail = self.server.fail
        if fail is not None and self.server.fail_times is not None:
            if self.server.fail_times <= 0:
                fail = None
            self.server.fail_times -= 1
        if fail == "hang-up":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fail == "http-500":
            error = json.dumps({"error": {"message": "the model is overloaded", "type": "server_error"}}).encode()
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        if self.path.endswith("/chat/completions"):
            reply = openai_reply(body, self.server.answer, self.server.say_while_asking)
            if body.get("stream"):
                self._stream(openai_chunks(reply, bool((body.get("stream_options") or {}).get("include_usage"))))
                return
        elif self.path.endswith("/messages"):
            reply = anthropic_reply(body, self.server.answer)
        else:
            self.send_error(404)
            return
        if not self.server.report_usage:
            reply = {key: value for key, value in reply.items() if key != "usage"}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, chunks: list[dict[str, Any]]) -> None:
        data = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data.encode())))
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *args: Any) -> None:
        pass


if __name__ == "__main__":
    server = FakeProviders(int(sys.argv[1]), *sys.argv[2:3], say_while_asking=len(sys.argv) > 3)
    print(server.url, flush=True)
    server.serve_forever()
