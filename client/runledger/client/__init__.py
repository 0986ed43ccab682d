"""runledger.client: write agent runs to a Runledger server, follow them, and route tool calls
through its gateway, from any Python harness. Needs only httpx.

    from runledger.client import Client

    with Client("http://127.0.0.1:8000", key) as client:
        with client.start_run("wfver_hello", input={"name": "Ada"}) as run:
            run.emit("StepScheduled", {"stepPath": "greet"})
            run.output = {"greeting": "Hello, Ada"}

`Client`/`AsyncClient` are the blocking and the asyncio flavours of the same API; errors are the
typed `ApiError` subclasses of `runledger.client.errors`.
"""

from __future__ import annotations

from ._core import Appended, Envelope, RetryPolicy, __version__
from .aio import (
    AsyncClient,
    AsyncFollow,
    AsyncModelCall,
    AsyncRun,
    AsyncSession,
    AsyncToolCall,
    current_async_session,
)
from .errors import (
    ApiError,
    BadRequest,
    Conflict,
    Fenced,
    Forbidden,
    IdempotencyConflict,
    InvalidEvent,
    LeaseLost,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RunAlreadyStarted,
    RunFinished,
    RunledgerError,
    RunNotStarted,
    SequenceConflict,
    ServerError,
    ToolCallFailed,
    ToolCallInDoubt,
    ToolCallInProgress,
    TransportError,
    Unauthenticated,
    UnknownEventType,
)
from .outbox import BufferFull, NotDelivered, Undelivered
from .sync import (
    Client,
    Follow,
    ModelCall,
    Run,
    Session,
    ToolCall,
    current_run,
    current_session,
    current_step,
    observe,
)
from .wrappers import wrap_anthropic, wrap_openai

__all__ = [
    "__version__",
    "Appended",
    "Envelope",
    "RetryPolicy",
    "Client",
    "Run",
    "ToolCall",
    "Session",
    "ModelCall",
    "Follow",
    "current_session",
    "current_run",
    "current_step",
    "observe",
    "wrap_openai",
    "wrap_anthropic",
    "Undelivered",
    "BufferFull",
    "NotDelivered",
    "AsyncClient",
    "AsyncRun",
    "AsyncToolCall",
    "AsyncSession",
    "AsyncModelCall",
    "AsyncFollow",
    "current_async_session",
    "RunledgerError",
    "TransportError",
    "ToolCallFailed",
    "ApiError",
    "BadRequest",
    "Unauthenticated",
    "Forbidden",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "RateLimited",
    "ServerError",
    "InvalidEvent",
    "UnknownEventType",
    "SequenceConflict",
    "IdempotencyConflict",
    "Fenced",
    "RunNotStarted",
    "RunAlreadyStarted",
    "RunFinished",
    "ToolCallInProgress",
    "ToolCallInDoubt",
    "LeaseLost",
]
