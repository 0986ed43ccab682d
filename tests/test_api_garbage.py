"""An API request's objects are freed when it ends, not left to the cyclic garbage collector.

DRF and Django link a view, its request and its response to one another; console.api.base.ApiView
cuts those links once the response is made, so that a batch's parsed body and the response's data
go as soon as the response does (bench/README.md § Floors, session 10: the collections they cost
were ~10 % of a 500-event POST in Daphne). Measured with the collector off: whatever is not freed
by reference counting alone would wait for it.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import orjson
import pytest
from django.test import RequestFactory

from console.api.events import RunEventsView
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _post(workspace: Workspace, run_id: str, events: list[dict[str, object]]) -> tuple[int, list[weakref.ref[object]]]:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    request = RequestFactory().post(
        f"/api/v1/runs/{run_id}/events",
        data=orjson.dumps({"events": events}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    response = RunEventsView.as_view()(request, run_id=run_id)
    context = response.renderer_context
    kept = [weakref.ref(context["view"]), weakref.ref(context["request"]), weakref.ref(response)]
    del context
    response.render()
    status = response.status_code
    del response
    return status, kept


def test_an_append_request_is_freed_without_the_cyclic_collector(workspace: Workspace, collector_off: None) -> None:
    events = [started(), *(ev("StepScheduled", stepPath=f"s{i}", tags=["a", {"b": i}]) for i in range(50))]
    status, kept = _post(workspace, "run_garbage", events)
    assert status == 200
    assert [ref() for ref in kept] == [None, None, None]  # the view, DRF's request, the response


def test_a_refused_request_is_freed_too(workspace: Workspace, collector_off: None) -> None:
    status, kept = _post(workspace, "run_garbage_bad", [ev("StepScheduled", stepPath="s")])  # no RunStarted first
    assert status == 409  # docs/api.md: a run's first event must be RunStarted
    assert [ref() for ref in kept] == [None, None, None]
