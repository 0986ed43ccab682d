"""A local stand-in for the OpenAI and Anthropic HTTP APIs (the edge of the world), so the real
`openai` and `anthropic` SDKs, and the instrumentations that wrap them, run unchanged in tests.

It answers `POST /v1/chat/completions` and `POST /v1/responses` (OpenAI) and `POST /v1/messages`
(Anthropic) like a weather agent's model: asked with tools and no tool result yet, it asks for
`get_weather(city=Paris)`; otherwise it answers in text. Asked to `stream`, the answer comes as
server-sent events in each API's wire format, text and tool-call arguments in several pieces: chat
chunks ending in `data: [DONE]`, with a last chunk of usage only when
`stream_options.include_usage` asks for it (as the service does: without it a stream reports no
usage at all); the Responses API's named events (`response.created` ... `response.completed`);
Anthropic's (`message_start`, content blocks with `text_delta` / `input_json_delta`,
`message_delta` with the output tokens, `message_stop`, a `ping` among them). OpenAI's reply names a dated model (`gpt-4o-2024-08-06`), as the real service does;
Anthropic's the model asked. Asked for `n` choices, it gives that many (the later ones' text marked `(candidate i)`). Set `report_usage` to False and `usage` is left out of every answer (as some
OpenAI-compatible servers do). Asked for structured output (chat's `response_format` or the
Responses API's `text.format` of type `json_schema`, as the SDKs' `parse` helpers send), the text
is JSON matching the schema, its strings `answer`. `answer` changes the final text (a
non-deterministic model: a restarted agent gets another answer); `requests` keeps every body.
Set `fail` to `"http-500"` and every call is answered HTTP 500 with an error body, to `"hang-up"`
and the connection is closed once the request is read, with no answer (a provider that went away),
to `"cut-stream"` and a stream's connection is closed after its first half of events (the rest
announced by its Content-Length, never sent: a connection lost mid-stream);
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
        if message.get("role") == "tool" or message.get("type") == "function_call_output":
            return False
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content):
            return False
    return True


def _structured(schema: dict[str, Any], answer: str) -> Any:
    """A value matching a JSON schema, as the SDKs' `parse` helpers send it: strings are `answer`,
    numbers 21, booleans true, arrays of one item; a `$ref` or `anyOf` takes its first choice."""
    definitions = schema.get("$defs") or {}

    def value(node: dict[str, Any]) -> Any:
        if "$ref" in node:
            return value(definitions[node["$ref"].rsplit("/", 1)[-1]])
        if "anyOf" in node:
            return value(node["anyOf"][0])
        kind = node.get("type")
        if "enum" in node:
            return node["enum"][0]
        if kind == "object":
            return {key: value(field) for key, field in (node.get("properties") or {}).items()}
        if kind == "array":
            return [value(node.get("items") or {})]
        return {"integer": 21, "number": 21, "boolean": True, "null": None}.get(str(kind), answer)

    return value(schema)


def openai_reply(body: dict[str, Any], answer: str, say_while_asking: bool = False) -> dict[str, Any]:
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":  # structured outputs: the answer as that JSON
        answer = json.dumps(_structured(response_format["json_schema"]["schema"], answer))
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
    deltas += [{"content": piece} for piece in pieces(message.get("content") or "")]
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
        deltas += [
            {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            for piece in pieces(function["arguments"])
        ]
    head = {key: reply[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas] + [
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    ]
    if include_usage:
        chunks = [{**chunk, "usage": None} for chunk in chunks] + [{**head, "choices": [], "usage": reply["usage"]}]
    return chunks


def pieces(text: str, count: int = 3) -> list[str]:
    """`text` cut in up to `count` pieces, as a stream sends it."""
    size = -(-len(text) // count) or 1
    return [text[i : i + size] for i in range(0, len(text), size)]


def responses_reply(body: dict[str, Any], answer: str) -> dict[str, Any]:
    """A Responses API answer: a function call when asked with tools and no tool output yet, else
    a message of `answer`."""
    given = body.get("input")
    text_format = (body.get("text") or {}).get("format") or {}
    if text_format.get("type") == "json_schema":  # structured outputs: the answer as that JSON
        answer = json.dumps(_structured(text_format["schema"], answer))
    if _asked_for_tool(given if isinstance(given, list) else [], body.get("tools")):
        output: list[dict[str, Any]] = [
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
                "status": "completed",
            }
        ]
    else:
        text = {"type": "output_text", "text": answer, "annotations": []}
        output = [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [text]}]
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1_700_000_000,
        "model": OPENAI_MODEL,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 120,
            "output_tokens": 30,
            "total_tokens": 150,
            "input_tokens_details": {"cached_tokens": 20},
            "output_tokens_details": {"reasoning_tokens": 5},
        },
    }


def responses_events(reply: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`reply` as the Responses API streams it: created, each output item added, its text or
    arguments in pieces and done, the item done, completed (the whole response)."""
    events: list[tuple[str, dict[str, Any]]] = []

    def event(type_: str, **fields: Any) -> None:
        events.append((type_, {"type": type_, "sequence_number": len(events), **fields}))

    event("response.created", response={**reply, "status": "in_progress", "output": [], "usage": None})
    for index, item in enumerate(reply["output"]):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            event(
                "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []}
            )
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            event("response.content_part.added", **at, content_index=0, part=part)
            for piece in pieces(text):
                event("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
            event("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            event("response.content_part.done", **at, content_index=0, part={**part, "text": text})
        else:
            event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            for piece in pieces(item["arguments"]):
                event("response.function_call_arguments.delta", **at, delta=piece)
            event("response.function_call_arguments.done", **at, arguments=item["arguments"])
        event("response.output_item.done", output_index=index, item=item)
    event("response.completed", response=reply)
    return events


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


def anthropic_events(reply: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`reply` as Anthropic streams it: message_start (no content, the input tokens and one output
    token), a ping, each content block started empty with its text or its input's JSON in pieces,
    message_delta (stop reason, the output tokens), message_stop."""
    usage = reply.get("usage")
    start = {**reply, "content": [], "stop_reason": None, "stop_sequence": None}
    if usage is not None:
        start["usage"] = {**usage, "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    events.append(("ping", {"type": "ping"}))
    for index, block in enumerate(reply["content"]):
        if block["type"] == "text":
            empty, deltas = {**block, "text": ""}, [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
        else:
            arguments = json.dumps(block["input"])
            empty = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(arguments)]
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": reply["stop_reason"], "stop_sequence": None},
    }
    delta["usage"] = {"output_tokens": usage["output_tokens"]} if usage is not None else {"output_tokens": None}
    events += [("message_delta", delta), ("message_stop", {"type": "message_stop"})]
    return events


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
        report_usage = self.server.report_usage
        if self.path.endswith("/chat/completions"):
            reply = openai_reply(body, self.server.answer, self.server.say_while_asking)
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                chunks = openai_chunks(reply, include_usage and report_usage)
                self._stream([(None, chunk) for chunk in chunks], done=True, cut=fail == "cut-stream")
                return
        elif self.path.endswith("/responses"):
            reply = responses_reply(body, self.server.answer)
            if not report_usage:
                reply["usage"] = None
            if body.get("stream"):
                self._stream(responses_events(reply), cut=fail == "cut-stream")
                return
        elif self.path.endswith("/messages"):
            reply = anthropic_reply(body, self.server.answer)
            if body.get("stream"):
                if not report_usage:
                    reply.pop("usage")
                self._stream(anthropic_events(reply), cut=fail == "cut-stream")
                return
        else:
            self.send_error(404)
            return
        if not report_usage:
            reply = {key: value for key, value in reply.items() if key != "usage"}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list[tuple[str | None, dict[str, Any]]], done: bool = False, cut: bool = False) -> None:
        """Server-sent events, named when the API names them (`event:` lines), then `data: [DONE]`
        when `done` (OpenAI's chat completions); `cut`: the first half sent, then the connection
        closed, its Content-Length saying more was to come."""
        frames = [(f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n" for name, data in events]
        if done:
            frames.append("data: [DONE]\n\n")
        data = "".join(frames).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if cut:
            self.wfile.write("".join(frames[: len(frames) // 2]).encode())
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


if __name__ == "__main__":
    server = FakeProviders(int(sys.argv[1]), *sys.argv[2:3], say_while_asking=len(sys.argv) > 3)
    print(server.url, flush=True)
    server.serve_forever()
