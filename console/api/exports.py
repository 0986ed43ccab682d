"""/api/v1/export/{runs|events|costs|audit} and /api/v1/runs/{runId}/evidence.zip (docs/api.md "Export
and interop"): files that leave the ledger, streamed, audited, checkable offline with `ledger
verify --export FILE` / `--bundle FILE` (ledger/interop/exports.py, ledger/interop/bundle.py, ledger/interop/offline.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpResponse, StreamingHttpResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework.request import Request

from ledger.interop import bundle, exports
from ledger.log.prepare import validate_run_id
from ledger.tenancy import access
from ledger.tenancy.access import tenant_admin

from .auth import access_for, principal
from .base import ApiView, require_accepted, run_for
from .pagination import InvalidParameter
from .schema import RUN_ID, WORKSPACE, error_responses

MEDIA_TYPES = {"jsonl": "application/x-ndjson", "csv": "text/csv; charset=utf-8"}


async def _pulled(pieces: Iterator[bytes]) -> AsyncIterator[bytes]:
    """A sync iterator served over ASGI one piece at a time: Django would otherwise read a sync
    iterator whole into a list before sending a byte (StreamingHttpResponse.__aiter__). Each
    piece is read in the thread that holds the request's database connection."""

    def following() -> bytes | None:
        return next(pieces, None)

    pull = sync_to_async(following, thread_sensitive=True)
    while (piece := await pull()) is not None:
        yield piece


def streamed(request: Request, pieces: Iterator[bytes], content_type: str) -> StreamingHttpResponse:
    """A streaming response that stays streamed under both handlers (WSGI reads sync iterators
    lazily; ASGI needs an async one)."""
    content = _pulled(pieces) if isinstance(request._request, ASGIRequest) else pieces
    response = StreamingHttpResponse(content, content_type=content_type)
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "no-store"
    return response


def _bound(request: Request, name: str, *, end: bool) -> Any:
    try:
        return exports.parse_bound(request.query_params.get(name), name, end=end)
    except ValueError:
        raise InvalidParameter(
            f"{name} must be a date YYYY-MM-DD or an ISO 8601 time (1900-01-01 to 9998-12-31)", parameter=name
        ) from None


def _selection(request: Request, kind: str) -> exports.Selection:
    params = request.query_params
    run_id = params.get("runId") or None
    filters = {k: params[k] for k in ("workspace", "tenant", "from", "to", "runId") if params.get(k)}
    start, end = _bound(request, "from", end=False), _bound(request, "to", end=True)
    if start is not None and end is not None and start >= end:
        raise InvalidParameter("from must be before to", parameter="from")
    who = principal(request)
    if kind == "audit":
        if run_id:
            raise InvalidParameter("runId does not apply to the audit log", parameter="runId")
        tenant = tenant_admin(who, tenant=params.get("tenant") or None, what="exporting the audit log")
        spaces = None
        if params.get("workspace"):
            space = access.resolve(who, workspace=params["workspace"], scope="read").workspace
            if space.tenant_id != tenant.pk:
                raise InvalidParameter("workspace is not one of the tenant's", parameter="workspace")
            spaces = [space]
        return exports.Selection(kind=kind, tenant=tenant, workspaces=spaces, start=start, end=end, filters=filters)
    if run_id is not None:
        validate_run_id(run_id)  # 400 invalid_run_id
    caller = access_for(request, "read", run_id=run_id)  # another workspace's run is 404, as everywhere
    return exports.Selection(
        kind=kind, workspaces=[caller.workspace], start=start, end=end, run_id=run_id, filters=filters
    )


class ExportView(ApiView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # ?format=jsonl|csv is this view's own switch, not DRF's renderer override; errors are JSON.
        # An Accept that admits not the format's media type is 406, before the credentials are
        # looked at (a ?format= none has is 400, below).
        fmt = request.query_params.get("format") or "jsonl"
        if not force and fmt in MEDIA_TYPES:
            require_accepted(request, MEDIA_TYPES[fmt], f"the {fmt} export")
        return super().perform_content_negotiation(request, force=True)

    kind = ""  # set by each path's subclass below

    @extend_schema(
        description=(
            "The whole selection in one streamed response (read in keyset-ordered chunks: memory stays flat "
            "for millions of rows), oldest first. JSONL: the first line is the header `{schemaVersion: 1, "
            'export, format, exportedAt, filters}`, then one object per row, and the last line `{"end": '
            '{"rows": N}}`; a file without it was cut short. CSV: the first line is `# ` and the same header '
            'JSON, then the column names, the rows, and last `# {"end":{"rows":N}}`; no data row begins '
            "with `#`. CSV text cells that begin with = + - @ ' a tab or a carriage return get a leading `'` "
            "(never run as a formula; drop one leading `'` to read the value back); JSON values (payload, "
            "input, output, error, details) are JSON text; an absent value is an empty cell.\n\n"
            "`events` carry workspace, runId, sequence, eventId, type, occurrenceId, recordedAt and the "
            "payload exactly as stored (RFC 8785), whole runs in creation order each up to its last "
            "sequence, so `manage.py ledger verify --export FILE` recomputes every id and checks each run is "
            "dense from 1. `from`/`to` pick runs (and their events) by the run's creation time, cost entries "
            "by when they were recorded, audit entries by their time. `runId` narrows runs, events and costs "
            "to one run of the workspace (another workspace's is 404). Every export is audited "
            "(`export.downloaded`). The audit export is the tenant's log (`?tenant=` when a member of "
            "several; `?workspace=` keeps one workspace's entries) and is refused to API keys (403)."
        ),
        parameters=[
            OpenApiParameter("format", OpenApiTypes.STR, enum=list(exports.FORMATS), description="default jsonl"),
            OpenApiParameter("from", OpenApiTypes.STR, description="YYYY-MM-DD or ISO 8601, inclusive"),
            OpenApiParameter("to", OpenApiTypes.STR, description="YYYY-MM-DD (that whole day) or ISO 8601, exclusive"),
            OpenApiParameter("runId", OpenApiTypes.STR, description="one run (not for audit)"),
            OpenApiParameter("tenant", OpenApiTypes.STR, description="audit: which tenant, for members of several"),
            WORKSPACE,
        ],
        responses={
            (200, "application/x-ndjson"): OpenApiResponse(OpenApiTypes.STR, description="JSONL"),
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="CSV"),
            **error_responses(
                e400=["invalid_parameter", "invalid_run_id", "workspace_required"],
                e403=["insufficient_scope", "forbidden"],
                e404=["not_found"],
                e406=["not_acceptable (an Accept that admits not the format's media type)"],
            ),
        },
        tags=["export"],
    )
    def get(self, request: Request) -> StreamingHttpResponse | HttpResponse:
        kind = self.kind
        fmt = request.query_params.get("format") or "jsonl"
        if fmt not in exports.FORMATS:
            raise InvalidParameter(f"format must be one of {', '.join(exports.FORMATS)}", parameter="format")
        selection = _selection(request, kind)
        # HEAD answers GET's checks and headers: nothing is exported, so nothing is audited.
        if request.method == "HEAD":
            return _head(MEDIA_TYPES[fmt], exports.filename(selection, fmt))
        exports.record_export(selection=selection, fmt=fmt, by=principal(request))
        response = streamed(request, exports.render(selection, fmt), MEDIA_TYPES[fmt])
        response["Content-Disposition"] = f'attachment; filename="{exports.filename(selection, fmt)}"'
        return response


SUMMARIES = {
    "runs": "The workspace's runs as a JSONL or CSV file, streamed (scope read)",
    "events": "The workspace's events, whole runs with ids and sequences, as a JSONL or CSV file, streamed "
    "(scope read)",
    "costs": "The workspace's cost entries as a JSONL or CSV file, streamed (scope read)",
    "audit": "The tenant's audit log as a JSONL or CSV file, streamed (admin session)",
}


def _head(media_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(content_type=media_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _export_view(kind: str) -> type[ExportView]:
    view = type(f"Export{kind.title()}View", (ExportView,), {"kind": kind})
    return extend_schema_view(get=extend_schema(operation_id=f"export_{kind}", summary=SUMMARIES[kind]))(view)


class RunEvidenceZipView(ApiView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # The one representation is the zip: an Accept that admits no application/zip (say
        # application/json, or application/zip;q=0) is 406, before the credentials are looked at,
        # as on the other endpoints; no Accept admits all. Errors are the JSON body either way.
        if not force:
            require_accepted(request, "application/zip", "the evidence bundle")
        return super().perform_content_negotiation(request, force=True)

    @extend_schema(
        operation_id="get_run_evidence_zip",
        summary="The evidence bundle as a deterministic zip, verifiable offline (scope read)",
        description=(
            "Entries in sorted order: `SHA256SUMS` (`sha256sum -c` format, every other entry), "
            "`artifacts/art_<sha256>` (the bytes of every artifact the log references), `events.jsonl` (the "
            "envelopes in sequence order, payloads as stored), `evidence.json` (as GET …/evidence) and "
            "`manifest.json` (run, lastSequence, files with sha256 and size, artifacts). The same run gives "
            "the same bytes (fixed timestamps and permissions, sorted entries, deflate level 9): the `ETag` "
            "is the zip's sha256. `manage.py ledger verify --bundle FILE` checks it without the ledger. "
            "Audited (`evidence_bundle.downloaded`, with the sha256)."
        ),
        parameters=[RUN_ID, WORKSPACE],
        responses={
            (200, "application/zip"): OpenApiResponse(OpenApiTypes.BINARY, description="the zip"),
            **error_responses(
                e400=["invalid_run_id", "workspace_required"],
                e403=["insufficient_scope"],
                e404=["not_found"],
                e406=["not_acceptable (an Accept that admits no application/zip)"],
            ),
        },
        tags=["export"],
    )
    def get(self, request: Request, run_id: str) -> FileResponse:
        _, run = run_for(request, run_id, "read")
        spooled = bundle.bundle_file(run)
        sha256 = bundle.file_sha256(spooled)
        if request.method != "HEAD":  # a HEAD downloads nothing: its ETag, and no audit entry
            bundle.record_bundle(run=run, by=principal(request), sha256=sha256)
        response = FileResponse(
            spooled, content_type="application/zip", as_attachment=True, filename=bundle.bundle_name(run)
        )
        response["ETag"] = f'"{sha256}"'
        response["X-Content-Type-Options"] = "nosniff"
        return response


# One path per export (not `export/<kind>`): each is declared on its own, with who may use it, and
# an unknown one is a plain 404.
urlpatterns = [
    *[path(f"export/{kind}", _export_view(kind).as_view(), name=f"api-export-{kind}") for kind in exports.KINDS],
    path("runs/<str:run_id>/evidence.zip", RunEvidenceZipView.as_view(), name="api-run-evidence-zip"),
]
