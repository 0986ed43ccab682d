"""Runtime benchmark: one agent loop run by our runtime, by DBOS and by LangGraph, on one PostgreSQL.

    .venv/bin/pip install -e '.[bench]' && .venv/bin/python bench/runtime.py [--calls 200] [--repeat 3] [--profile]
        [--round-trips] [--census]

The loop: N model turns that each ask for one tool call, then one turn that answers; so N + 1
model calls and N tool calls, the model a deterministic scripted function (no network), the tool
a dictionary lookup. The conversation grows by two messages per turn, as an agent's does.

  ours                  ledger.runtime: one ai.generate step; per model call harness.model.called
                        (committed before the call, with the previous tool call's succeeded) and
                        harness.model.responded (committed with the gateway's claim of the tool call
                        it asks for, stamped outbound): two commits per model call with its tool
                        call, all under the run lease's fencing token, each one statement and one
                        round trip (the gateway's row attached to the append's statement)
  ours, no projections  the same with the append's projection rows switched off (events, head and
                        gateway row only; not a product configuration): what the projections,
                        written in the append's transaction by docs/design.md, cost a model call
  floor                 two bare durable commits per model call (single-row INSERTs), nothing else
  DBOS                  @DBOS.workflow with one @DBOS.step per model call, the tool call inside it
  DBOS, tool step       the same with the tool call as its own @DBOS.step
  LangGraph             StateGraph with PostgresSaver, one node per model call (tool call inside),
                        looping on itself; durability="sync" (a checkpoint is committed before the
                        next node starts, as ours is)
  LangGraph, async      the same with LangGraph's default durability="async"
  LangGraph, tool node  durability="sync", the tool call in a node of its own (agent -> tools -> agent)

Databases on one server: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/runledger_bench,
migrated) for ours, <db>_dbos and <db>_langgraph for the peers (dropped and created afresh each
run). Every configuration runs a short loop unmeasured (warm-up), then --repeat times, interleaved;
the figure is the median. See bench/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import operator
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

if not __package__:  # run as a script: import the bench package from the repository root (bench/common.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cleanup, head_only_changes, head_only_totals, profile, record, setup_django  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/runledger_bench"

# Targets (issue 37, replacing issue 5's "3x DBOS", which compared us with a peer recording less
# than we do): recorded model calls per second, ours over theirs. At least 1x each peer's lightest
# configuration (one checkpoint or step per model call with the tool call inside it, committed
# before the next one starts: LangGraph's durability="sync"; its "async" promises nothing durable
# before the next node runs, which ours does), and at least 2x each at equal durability: the tool
# call as its own durable step, as ours records it (claimed outbound before it runs, its result
# committed before the next model call).
TARGETS = {"LangGraph": 1.0, "DBOS": 1.0, "LangGraph, tool node": 2.0, "DBOS, tool step": 2.0}
PEER_FIGURES = {
    "LangGraph": "LangGraph (sync) steps/s",
    "DBOS": "DBOS steps/s",
    "LangGraph, tool node": "LangGraph (sync), tool call its own node, steps/s",
    "DBOS, tool step": "DBOS, tool call its own step, steps/s",
}

# Ours with the projection rows switched off (Ours.runner_without_projections): for the floor analysis only.
NO_PROJECTIONS = "ours, no projections"

SYSTEM = "You check orders and report their status."
PROMPT = "Check every order on the list and tell me which are late."


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/runtime.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200, help="model turns with a tool call per run (default 200)")
    p.add_argument("--repeat", type=int, default=3, help="measured runs per configuration (default 3)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the table, run ours once more under cProfile and print where the time goes",
    )
    p.add_argument(
        "--census",
        action="store_true",
        help="after the table, run each configuration once more and print the transactions and "
        "rows it wrote per model call, from pg_stat_database (waits ~11 s per configuration "
        "for the server's statistics to settle)",
    )
    p.add_argument(
        "--round-trips",
        action="store_true",
        help="after the table, run ours once more under libpq's protocol trace and print its round "
        "trips to PostgreSQL per model call, and the statements they carried",
    )
    p.add_argument(
        "--only",
        choices=("ours", "dbos", "langgraph"),
        action="append",
        help="measure only these systems (repeatable); default all",
    )
    p.add_argument("--keep", action="store_true", help="keep our bench runs (default: delete them)")
    args = p.parse_args(argv)
    if args.calls < 1 or args.repeat < 1:
        p.error("need --calls >= 1 and --repeat >= 1")
    return args


# --- the agent loop's parts, shared by all three ----------------------------------------------


def script_entry(turn: int, calls: int) -> dict[str, Any]:
    """The scripted model: turns 1..calls ask for one lookup each, turn calls+1 answers."""
    usage = {"inputTokens": 200 + 40 * turn, "outputTokens": 24, "cachedInputTokens": 160}
    if turn <= calls:
        return {
            "text": None,
            "usage": usage,
            "toolCalls": [{"id": f"call_{turn}", "name": "lookup_order", "args": {"orderId": f"A-{turn}"}}],
        }
    return {"text": f"Checked {calls} orders; none is late.", "toolCalls": [], "usage": usage}


def lookup_order(args: Any) -> dict[str, Any]:
    return {"orderId": args["orderId"], "status": "shipped", "carrier": "DHL"}


def assistant_message(reply: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": reply["text"], "toolCalls": reply["toolCalls"]}


def tool_message(call: dict[str, Any], result: Any) -> dict[str, Any]:
    return {"role": "tool", "toolCallId": call["id"], "result": result}


def first_messages() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]


def scripted_model(turn: int, messages: list[dict[str, Any]], calls: int) -> dict[str, Any]:
    # What a model sees is the conversation; the scripted one checks it has the expected length.
    assert len(messages) == 2 * turn, (turn, len(messages))
    return script_entry(turn, calls)


# --- setup --------------------------------------------------------------------------------------


def database_urls() -> tuple[str, str, str]:
    url = os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    if not url.startswith(("postgres://", "postgresql://")):
        sys.stderr.write(f"bench/runtime.py measures PostgreSQL only; DATABASE_URL is {url.split('://')[0]}://...\n")
        raise SystemExit(2)
    base, _, name = url.rpartition("/")
    base = "postgresql://" + base.split("://", 1)[1]
    return f"{base}/{name}", f"{base}/{name}_dbos", f"{base}/{name}_langgraph"


def prepare_databases(ours: str, peers: list[str]) -> None:
    """Create ours if missing; drop and create the peers' so every run starts from empty tables."""
    import psycopg

    base, _, _ = ours.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        existing = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
        name = ours.rpartition("/")[2]
        if name not in existing:
            conn.execute(f'CREATE DATABASE "{name}"')
        for url in peers:
            peer = url.rpartition("/")[2]
            conn.execute(f'DROP DATABASE IF EXISTS "{peer}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{peer}"')


# --- the three systems --------------------------------------------------------------------------


class Ours:
    label = "ours"

    def __init__(self) -> None:
        from ledger.tenancy.services import bootstrap

        self.workspace = bootstrap(tenant="bench", workspace=f"runtime-{datetime.now(UTC):%Y%m%d%H%M%S}-{os.getpid()}")
        self.run_ids: list[str] = []

    def workflow(self, calls: int) -> Any:
        from ledger.runtime.providers import ModelRequest, ScriptedProvider
        from ledger.runtime.registry import AIGenerate, Tool, Workflow

        def model(request: ModelRequest) -> dict[str, Any]:
            return scripted_model(request.turn, list(request.body["messages"]), calls)

        return Workflow(
            name=f"bench_agent_loop_{calls}",
            steps=(AIGenerate("agent", PROMPT, system=SYSTEM, tools=("lookup_order",), max_turns=calls + 1),),
            tools={
                "lookup_order": Tool(
                    "lookup_order",
                    lookup_order,
                    description="Find an order by id",
                    parameters={"type": "object", "properties": {"orderId": {"type": "string"}}},
                )
            },
            models={"default": ScriptedProvider(script=model, model_id="gpt-4o-mini", name="openai")},
        )

    def runner(self, calls: int) -> Callable[[], Any]:
        from ledger.runtime.executor import new_run_id, start_run

        workflow = self.workflow(calls)

        def run() -> Any:
            run_id = new_run_id()
            self.run_ids.append(run_id)
            outcome = start_run(workspace=self.workspace, workflow=workflow, input={"calls": calls}, run_id=run_id)
            assert outcome.status == "completed", outcome
            return outcome.output

        return run

    def runner_without_projections(self, calls: int) -> Callable[[], Any]:
        """The same runs with the append's projection rows switched off (`batch_changes` answers
        the head's sequence and status only, as bench/ingest.py's upkeep figure does): the events,
        the head and the gateway's control row are written, the run's, step, tool-call, cost-entry
        and usage rows are not. Not a product configuration: the bound on what the projections,
        which docs/design.md writes in the append's transaction, cost a model call."""
        import ledger.log.strategies as append_module

        run = self.runner(calls)

        def run_without() -> Any:
            real, real_totals = append_module.batch_changes, append_module.batch_totals
            append_module.batch_changes, append_module.batch_totals = head_only_changes, head_only_totals
            try:
                return run()
            finally:
                append_module.batch_changes, append_module.batch_totals = real, real_totals

        return run_without

    def check(self, calls: int) -> str:
        from ledger.log.envelopes import log_of
        from ledger.models import Run

        log = log_of(Run.objects.get(workspace=self.workspace, run_id=self.run_ids[-1]))
        types = [e["type"] for e in log]
        assert types.count("harness.model.responded") == calls + 1
        assert types.count("harness.tool_call.succeeded") == calls
        return f"{len(log)} events in the last run's log"

    def close(self, keep: bool) -> None:
        if not keep:
            cleanup(self.workspace, self.run_ids)


class Floor:
    """The floor of ours under its durability contract: the same loop (scripted model, tool) with
    nothing recorded but two durable commits per model call, each a bare single-row INSERT in
    autocommit on a plain psycopg connection to our database (a WAL flush and one round trip
    each): the intent before the model is asked, the answer before the tool runs."""

    label = "floor: 2 commits/call"
    TABLE = "bench_runtime_floor"

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {self.TABLE} (id bigserial PRIMARY KEY, turn int, fact text)")

    def runner(self, calls: int) -> Callable[[], Any]:
        insert = f"INSERT INTO {self.TABLE} (turn, fact) VALUES (%s, %s)"

        def run() -> Any:
            messages = first_messages()
            for turn in range(1, calls + 2):
                self.conn.execute(insert, (turn, "called"), prepare=True)
                reply = scripted_model(turn, messages, calls)
                self.conn.execute(insert, (turn, "responded"), prepare=True)
                messages.append(assistant_message(reply))
                if not reply["toolCalls"]:
                    return reply["text"]
                messages.extend(tool_message(c, lookup_order(c["args"])) for c in reply["toolCalls"])
            raise RuntimeError("no answer")

        return run

    def close(self) -> None:
        self.conn.execute(f"DROP TABLE IF EXISTS {self.TABLE}")
        self.conn.close()


class Dbos:
    def __init__(self, url: str) -> None:
        from dbos import DBOS

        self.DBOS = DBOS
        self.url = url
        DBOS(config={"name": "runledger_bench", "system_database_url": url, "log_level": "WARNING"})

        @DBOS.step()
        def model_and_tool(turn: int, messages: list[dict[str, Any]], calls: int) -> dict[str, Any]:
            reply = scripted_model(turn, messages, calls)
            return {"reply": reply, "results": [lookup_order(c["args"]) for c in reply["toolCalls"]]}

        @DBOS.step()
        def model(turn: int, messages: list[dict[str, Any]], calls: int) -> dict[str, Any]:
            return scripted_model(turn, messages, calls)

        @DBOS.step()
        def tool(args: dict[str, Any]) -> dict[str, Any]:
            return lookup_order(args)

        @DBOS.workflow()
        def agent_loop(calls: int) -> str:
            messages = first_messages()
            for turn in range(1, calls + 2):
                done = model_and_tool(turn, messages, calls)
                reply = done["reply"]
                messages.append(assistant_message(reply))
                if not reply["toolCalls"]:
                    return reply["text"]
                messages.extend(tool_message(c, r) for c, r in zip(reply["toolCalls"], done["results"]))
            raise RuntimeError("no answer")

        @DBOS.workflow()
        def agent_loop_tool_steps(calls: int) -> str:
            messages = first_messages()
            for turn in range(1, calls + 2):
                reply = model(turn, messages, calls)
                messages.append(assistant_message(reply))
                if not reply["toolCalls"]:
                    return reply["text"]
                messages.extend(tool_message(c, tool(c["args"])) for c in reply["toolCalls"])
            raise RuntimeError("no answer")

        self.loops = {"DBOS": agent_loop, "DBOS, tool step": agent_loop_tool_steps}
        DBOS.launch()

    def runner(self, label: str, calls: int) -> Callable[[], Any]:
        loop = self.loops[label]
        return lambda: loop(calls)

    def check(self, calls: int) -> str:
        import psycopg

        with psycopg.connect(self.url) as conn:
            steps = conn.execute("SELECT count(*) FROM dbos.operation_outputs").fetchone()[0]
            flows = conn.execute("SELECT count(*) FROM dbos.workflow_status").fetchone()[0]
        return f"{steps} recorded steps in {flows} workflows"

    def close(self) -> None:
        self.DBOS.destroy()


class LangGraph:
    def __init__(self, url: str) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph

        self._cm = PostgresSaver.from_conn_string(url)
        self.saver = self._cm.__enter__()
        self.saver.setup()

        class State(TypedDict):
            messages: Annotated[list, operator.add]
            turn: int
            calls: int
            answer: str | None

        def agent(state: State) -> dict[str, Any]:
            turn = state["turn"] + 1
            reply = scripted_model(turn, state["messages"], state["calls"])
            new = [assistant_message(reply)]
            new.extend(tool_message(c, lookup_order(c["args"])) for c in reply["toolCalls"])
            return {"messages": new, "turn": turn, "answer": None if reply["toolCalls"] else reply["text"]}

        def model_only(state: State) -> dict[str, Any]:
            turn = state["turn"] + 1
            reply = scripted_model(turn, state["messages"], state["calls"])
            return {
                "messages": [assistant_message(reply)],
                "turn": turn,
                "answer": None if reply["toolCalls"] else reply["text"],
            }

        def tools(state: State) -> dict[str, Any]:
            calls = state["messages"][-1]["toolCalls"]
            return {"messages": [tool_message(c, lookup_order(c["args"])) for c in calls]}

        def done_or(node: str) -> Callable[[State], str]:
            return lambda s: END if s["answer"] is not None else node

        one_node = StateGraph(State)
        one_node.add_node("agent", agent)
        one_node.add_edge(START, "agent")
        one_node.add_conditional_edges("agent", done_or("agent"))
        two_nodes = StateGraph(State)
        two_nodes.add_node("agent", model_only)
        two_nodes.add_node("tools", tools)
        two_nodes.add_edge(START, "agent")
        two_nodes.add_conditional_edges("agent", done_or("tools"))
        two_nodes.add_edge("tools", "agent")
        self.graphs = {
            "one": one_node.compile(checkpointer=self.saver),
            "two": two_nodes.compile(checkpointer=self.saver),
        }
        self.threads = 0

    def runner(self, label: str, calls: int) -> Callable[[], Any]:
        durability = "async" if label.endswith("async") else "sync"
        graph = self.graphs["two" if "tool node" in label else "one"]

        def run() -> Any:
            self.threads += 1
            config = {
                "configurable": {"thread_id": f"bench-{os.getpid()}-{self.threads}"},
                "recursion_limit": 2 * calls + 10,
            }
            state = graph.invoke(
                {"messages": first_messages(), "turn": 0, "calls": calls, "answer": None}, config, durability=durability
            )
            return state["answer"]

        return run

    def check(self, calls: int) -> str:
        with self.saver.conn.cursor() as cur:
            cur.execute("SELECT count(*) AS n FROM checkpoints")
            checkpoints = cur.fetchone()["n"]
        return f"{checkpoints} checkpoints recorded"

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


# --- measuring ----------------------------------------------------------------------------------


class CpuMeter:
    """CPU time around a run: this process's (every thread: a peer's background writer too) and
    the server's, summed over the backends connected to the configuration's database (read from
    /proc, so only for a server on this machine; None otherwise). CPU is what a loaded machine
    inflates least: a run's wall time waits for cores the other processes hold, its CPU does not."""

    def __init__(self, admin_url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(admin_url, autocommit=True)
        self.tick = os.sysconf("SC_CLK_TCK")

    def server(self, database: str) -> float | None:
        pids = self.conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,)).fetchall()
        total = 0
        for (pid,) in pids:
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue  # a backend that ended since: its CPU is not counted
            except OSError:
                return None
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / self.tick

    def close(self) -> None:
        self.conn.close()


# A run's CPU: (this process's seconds, the server's seconds or None).
Cpu = tuple[float, float | None]


def measure(
    makers: dict[str, Callable[[int], Callable[[], Any]]],
    calls: int,
    repeat: int,
    meter: CpuMeter | None = None,
    databases: dict[str, str] | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[Cpu]]]:
    """Median-ready seconds per configuration: a short warm-up loop each (imports, connections,
    plan caches), then `repeat` rounds that run every configuration once, interleaved, so that a
    change in the machine's load hits all of them alike. With a `meter`, each run's CPU too
    (`databases`: each configuration's database, by its label's first part)."""
    warm = min(calls, 10)
    for label, make in makers.items():
        assert make(warm)() == expected_answer(warm), label
    runners = {label: make(calls) for label, make in makers.items()}
    seconds: dict[str, list[float]] = {label: [] for label in runners}
    cpu: dict[str, list[Cpu]] = {label: [] for label in runners}
    for _ in range(repeat):
        for label, run in runners.items():
            database = (databases or {}).get(label.split(",")[0])
            server = meter.server(database) if meter and database else None
            process = time.process_time()
            start = time.perf_counter()
            output = run()
            seconds[label].append(time.perf_counter() - start)
            process = time.process_time() - process
            after = meter.server(database) if meter and database and server is not None else None
            cpu[label].append((process, None if after is None or server is None else after - server))
            assert output == expected_answer(calls), (label, output)
    return seconds, cpu


def expected_answer(calls: int) -> str:
    return script_entry(calls + 1, calls)["text"]


def print_table(seconds: dict[str, list[float]], calls: int) -> None:
    model_calls = calls + 1
    rates = {label: model_calls / statistics.median(s) for label, s in seconds.items()}
    print(f"\n{model_calls} model calls + {calls} tool calls per run; median of {len(next(iter(seconds.values())))}")
    print(f"{'system':<20} {'calls/s':>9} {'ms/call':>9} {'run s':>8}  {'ours is':>8}")
    for label, rate in rates.items():
        ratio = f"{rates['ours'] / rate:7.2f}x" if "ours" in rates and label != "ours" else ""
        print(f"{label:<20} {rate:9.1f} {1000 / rate:9.2f} {model_calls / rate:8.3f}  {ratio:>8}")
    if "ours" in rates:
        print()
        if Floor.label in rates:
            to_floor = rates["ours"] / rates[Floor.label]
            print(f"ours / its floor (two bare durable commits per model call): {to_floor:.2f}x")
            record(
                "runtime: recorded model calls/s / two bare durable commits per call (its floor)",
                value=rates["ours"],
                unit="calls/s",
                baseline=rates[Floor.label],
                ratio=to_floor,
                target="(for the floor analysis)",
                met=None,
            )
        if NO_PROJECTIONS in rates:
            share = 1 - rates["ours"] / rates[NO_PROJECTIONS]
            peers = ", ".join(f"{rates[NO_PROJECTIONS] / rates[peer]:.2f}x {peer}" for peer in TARGETS if peer in rates)
            print(
                f"ours without its projection rows: {rates[NO_PROJECTIONS]:.1f} calls/s; the projections are "
                f"{share:.0%} of a model call" + (f"; without them ours would be {peers}" if peers else "")
            )
            record(
                "runtime: recorded model calls/s / the same with no projection rows written (for the floor)",
                value=rates["ours"],
                unit="calls/s",
                baseline=rates[NO_PROJECTIONS],
                ratio=rates["ours"] / rates[NO_PROJECTIONS],
                target="(for the floor analysis)",
                met=None,
                note=f"without them ours would be {peers}" if peers else "",
            )
        for peer, target in TARGETS.items():
            if peer in rates:
                ratio = rates["ours"] / rates[peer]
                print(f"Target: ours >= {target:g}x {peer}: {ratio:.2f}x {'MET' if ratio >= target else 'NOT MET'}")
                record(
                    f"runtime: recorded model calls/s / {PEER_FIGURES[peer]}",
                    value=rates["ours"],
                    unit="calls/s",
                    baseline=rates[peer],
                    ratio=ratio,
                    target=f"≥ {target:g}×",
                    met=ratio >= target,
                )


def print_cpu(cpu: dict[str, list[Cpu]], calls: int) -> None:
    """The CPU a model call took, median of the runs: this process's and the server's, and ours
    against each peer's sum."""
    model_calls = calls + 1

    def ms(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return 1000 * statistics.median(known) / model_calls if known and len(known) == len(values) else None

    rows = {label: (ms([c[0] for c in runs]), ms([c[1] for c in runs])) for label, runs in cpu.items() if runs}
    if not rows:
        return
    print("\nCPU per model call, ms (median of the runs; the server's from /proc: its backends on the database)")
    print(f"{'system':<20} {'this process':>12} {'server':>8} {'both':>8}  {'ours is':>8}")
    both = {label: p + s if p is not None and s is not None else None for label, (p, s) in rows.items()}
    ours = both.get("ours")
    for label, (process, server) in rows.items():
        total = both[label]
        ratio = f"{total / ours:7.2f}x" if ours and total and label != "ours" else ""
        print(
            f"{label:<20} {process or 0:12.3f} "
            + (f"{server:8.3f} {total:8.3f}" if server is not None and total is not None else f"{'-':>8} {'-':>8}")
            + f"  {ratio:>8}"
        )
    for peer in ("LangGraph", "DBOS"):
        theirs = both.get(peer)
        if ours and theirs:
            record(
                f"runtime: CPU per model call (this process + its server backends), {peer} / ours",
                value=ours,
                unit="ms",
                baseline=theirs,
                ratio=theirs / ours,
                target="(for the floor analysis)",
                met=None,
            )


def profile_ours(run: Callable[[], Any], calls: int, top: int = 30) -> None:
    """cProfile of one run of ours, then one run with synchronous_commit=off on our connection
    (not durable: it only shows how much of a run is waiting for WAL flushes)."""
    from django.db import connection

    profile("ours, one run", run, top=top, top_tottime=20)
    timings = {}
    for mode in ("on", "off"):
        with connection.cursor() as cur:
            cur.execute(f"SET synchronous_commit TO {mode}")
        start = time.perf_counter()
        run()
        timings[mode] = time.perf_counter() - start
    with connection.cursor() as cur:
        cur.execute("RESET synchronous_commit")
    print(
        f"\nours, one run each: synchronous_commit=on {timings['on']:.2f}s "
        f"({(calls + 1) / timings['on']:.1f} calls/s), off {timings['off']:.2f}s "
        f"({(calls + 1) / timings['off']:.1f} calls/s): WAL flush waits are about "
        f"{max(0.0, 1 - timings['off'] / timings['on']):.0%} of a run"
    )


def round_trips(run: Callable[[], Any], calls: int, top: int = 8) -> None:
    """Round trips of one run of ours on its PostgreSQL connection, from libpq's protocol trace:
    each ends with the server's ReadyForQuery. Beside them, the statements sent (simple-protocol
    queries such as BEGIN and COMMIT; Parse of a statement prepared now; Bind of a prepared one or
    of an unnamed one with its parameters), the most frequent first."""
    import re
    import tempfile
    from collections import Counter

    import psycopg
    from django.db import connection

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            run()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode(errors="replace").splitlines()
    trips = sum(1 for line in lines if "\tReadyForQuery" in line)
    prepared: dict[str, str] = {}  # a prepared statement's name: its text
    sent: Counter[str] = Counter()
    for line in lines:
        m = re.match(r'F\s+\d+\s+(Query|Parse|Bind)\s+"([^"]*)"\s+(?:"([^"]*)"\s+)?"?(.*)', line)
        if m is None:
            continue
        kind, first, second, rest = m.groups()
        if kind == "Query":
            sent[f"{first}"] += 1
        elif kind == "Parse" and first:
            prepared[first] = rest
        elif kind == "Parse":  # an unnamed statement, bound and run at once
            sent[rest] += 1
        elif second:  # Bind of a prepared statement, named for now
            sent[f"[prepared] {second}"] += 1
    with connection.cursor() as cur:  # the statements prepared before the trace began
        cur.execute("SELECT name, statement FROM pg_prepared_statements")
        prepared = {**dict(cur.fetchall()), **prepared}

    def label(text: str) -> str:
        named = re.match(r"\[prepared\] (\S+)$", text)
        if named:
            text = "[prepared] " + prepared.get(named[1], named[1])
        ctes = re.findall(r"(?:WITH|,) (\w+) AS \(", text)
        return f"{text[: text.index('WITH')]}one statement: {' + '.join(ctes)}" if "WITH head AS" in text else text

    labelled: Counter[str] = Counter()
    for text, n in sent.items():
        labelled[label(text)] += n
    model_calls = calls + 1
    print(
        f"\nours, one run of {model_calls} model calls: {trips} round trips to PostgreSQL, "
        f"{trips / model_calls:.2f} per model call; statements sent, most frequent first (per model call):"
    )
    for text, n in labelled.most_common(top):
        print(f"  {n / model_calls:5.2f}  {text[:150]}")


SETTLE_S = 11.0  # an idle backend flushes its statistics after 10 s (PostgreSQL 15+)
SETTLE_MAX_S = 75.0  # a flush that found the shared entry locked is retried, forced after 60 s


def census(
    makers: dict[str, Callable[[int], Callable[[], Any]]], databases: dict[str, str], admin_url: str, calls: int
) -> None:
    """Transactions committed and rows written (inserted + updated + deleted) per model call, as
    the server counts them in pg_stat_database, for one run of each configuration. Read-only
    transactions count too (they cost no WAL flush), and so does what a system's background
    threads do while the statistics settle (DBOS polls its queues), so rows are the firmer figure."""
    import psycopg

    def snapshot() -> dict[str, tuple[int, int]]:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT datname, xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database"
            ).fetchall()
        return {name: (commits, tuples) for name, commits, tuples in rows}

    def settled() -> dict[str, tuple[int, int]]:
        """A snapshot once every backend has flushed: rows written unchanged for two polls."""
        time.sleep(SETTLE_S)
        deadline = time.monotonic() + SETTLE_MAX_S - SETTLE_S
        last = snapshot()
        while time.monotonic() < deadline:
            time.sleep(2.0)
            now = snapshot()
            if all(now[db][1] == last.get(db, (0, 0))[1] for db in databases.values() if db in now):
                return now
            last = now
        return last

    runners = {label: make(calls) for label, make in makers.items()}
    before = settled()
    print(f"\nper model call, one run of {calls + 1} calls each (pg_stat_database):")
    print(f"{'system':<20} {'transactions':>12} {'rows written':>13}")
    for label, run in runners.items():
        run()
        after = settled()
        db = databases[label.split(",")[0]]
        commits, tuples = (after[db][i] - before[db][i] for i in (0, 1))
        print(f"{label:<20} {commits / (calls + 1):12.1f} {tuples / (calls + 1):13.1f}", flush=True)
        before = after


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    only = set(args.only or ("ours", "dbos", "langgraph"))
    missing = [
        m
        for m, system in (("dbos", "dbos"), ("langgraph.checkpoint.postgres", "langgraph"))
        if system in only and importlib.util.find_spec(m.split(".")[0]) is None
    ]
    if missing:
        sys.stderr.write(
            f"bench/runtime.py needs {', '.join(missing)}: .venv/bin/pip install -e '.[bench]' "
            "(or leave them out with --only ours)\n"
        )
        return 2
    ours_url, dbos_url, lg_url = database_urls()
    prepare_databases(ours_url, [u for s, u in (("dbos", dbos_url), ("langgraph", lg_url)) if s in only])
    # DEBUG makes Django keep every query it ran; production runs without it, so the bench does.
    setup_django(production=True)

    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT version(), current_setting('synchronous_commit')")
        version, sync_commit = cur.fetchone()
    print(
        f"PostgreSQL {version.split()[1]} (synchronous_commit={sync_commit}), "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; databases {ours_url.rpartition('/')[2]}"
        + (f", {dbos_url.rpartition('/')[2]}" if "dbos" in only else "")
        + (f", {lg_url.rpartition('/')[2]}" if "langgraph" in only else "")
        + "; load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    )

    ours = Ours() if "ours" in only else None
    floor = Floor(ours_url) if ours else None
    dbos = Dbos(dbos_url) if "dbos" in only else None
    graph = LangGraph(lg_url) if "langgraph" in only else None
    try:
        makers: dict[str, Callable[[int], Callable[[], Any]]] = {}
        if ours and floor:
            makers["ours"] = ours.runner
            makers[NO_PROJECTIONS] = ours.runner_without_projections
            makers[floor.label] = floor.runner
        if dbos:
            for label in ("DBOS", "DBOS, tool step"):
                makers[label] = lambda n, label=label: dbos.runner(label, n)
        if graph:
            for label in ("LangGraph", "LangGraph, async", "LangGraph, tool node"):
                makers[label] = lambda n, label=label: graph.runner(label, n)
        databases = {
            "ours": ours_url.rpartition("/")[2],
            Floor.label: ours_url.rpartition("/")[2],
            "DBOS": dbos_url.rpartition("/")[2],
            "LangGraph": lg_url.rpartition("/")[2],
        }
        meter = CpuMeter(ours_url.rpartition("/")[0] + "/postgres")
        try:
            seconds, cpu = measure(makers, args.calls, args.repeat, meter, databases)
        finally:
            meter.close()
        for system in (ours, dbos, graph):
            if system is not None:
                print(f"  recorded: {type(system).__name__}: {system.check(args.calls)}")
        print_table(seconds, args.calls)
        print_cpu(cpu, args.calls)
        if args.census:
            census(makers, databases, ours_url.rpartition("/")[0] + "/postgres", args.calls)
        if args.round_trips and ours:
            round_trips(ours.runner(args.calls), args.calls)
        if args.profile and ours:
            profile_ours(ours.runner(args.calls), args.calls)
    finally:
        if graph:
            graph.close()
        if floor:
            floor.close()
        if dbos:
            dbos.close()
        if ours:
            ours.close(args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
