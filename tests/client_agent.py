"""Harnesses written with runledger.client as a user writes one, run as their own processes by
tests/test_client_resilience.py (the server's URL and key in RUNLEDGER_URL / RUNLEDGER_KEY):

    python tests/client_agent.py exit-without-flush RUN_ID
        starts a run, emits three steps and returns from main without flush() or close()
    python tests/client_agent.py exit-while-down RUN_ID SPOOL_DIR
        the same against a server that does not answer, exiting after one second, with a spool
    python tests/client_agent.py weather RUN_ID OPENAI_URL [crash]
        a weather agent: the real openai SDK, wrapped (wrap_openai), asks its model, which asks for
        a tool; the tool goes through the gateway; the model answers. With `crash` the process dies
        (os._exit, no flush) right after the tool, as a harness killed mid-run does.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from runledger.client import Client, Undelivered, observe, wrap_openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def client(**options: Any) -> Client:
    return Client(os.environ["RUNLEDGER_URL"], os.environ["RUNLEDGER_KEY"], **options)


def exit_without_flush(run_id: str) -> None:
    run = client().start_run("wfver_exit", run_id=run_id, flush_interval=600)
    for n in range(3):
        run.emit("StepScheduled", {"stepPath": f"s{n}"})
    print("emitted", flush=True)


def exit_while_down(run_id: str, spool_dir: str) -> None:
    def heard(undelivered: Undelivered) -> None:
        print(f"undelivered {undelivered.run_id} {len(undelivered.events)} {undelivered.spooled}", flush=True)

    run = client(spool_dir=spool_dir, on_undelivered=heard, exit_timeout=1.0).start_run(
        "wfver_down", run_id=run_id, start_timeout=0.5, flush_interval=600
    )
    for n in range(3):
        run.emit("StepScheduled", {"stepPath": f"s{n}"})
    print("emitted", flush=True)


def weather(run_id: str, openai_url: str, crash: bool) -> None:
    import openai

    llm = wrap_openai(openai.OpenAI(base_url=f"{openai_url}/v1", api_key="sk-test", max_retries=0))

    @observe
    def ask(messages: list[dict[str, Any]]) -> Any:
        return llm.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)

    with client().start_run("wfver_weather", run_id=run_id, input={"city": "Paris"}) as run:
        with run.session(role="agent") as session:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You are a terse weather agent."},
                {"role": "user", "content": "Weather in Paris?"},
            ]
            first = ask(messages)
            asked = first.choices[0].message
            call = asked.tool_calls[0]
            with session.tool_call("get_weather", json.loads(call.function.arguments), effect="read") as tool:
                if not tool.replayed:
                    tool.result = {"city": "Paris", "celsius": 21}
            if crash:
                print(json.dumps({"first": asked.content}), flush=True)
                os._exit(3)  # killed: no flush, no atexit
            messages += [
                asked.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(tool.result)},
            ]
            final = ask(messages)
            session.output = final.choices[0].message.content
        run.output = {"answer": session.output}
    print(json.dumps({"first": asked.content, "final": session.output}), flush=True)


if __name__ == "__main__":
    mode, run_id = sys.argv[1], sys.argv[2]
    if mode == "exit-without-flush":
        exit_without_flush(run_id)
    elif mode == "exit-while-down":
        exit_while_down(run_id, sys.argv[3])
    else:
        weather(run_id, sys.argv[3], crash=sys.argv[4:] == ["crash"])
