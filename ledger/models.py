"""The ledger's tables: tenancy, the run head, the append-only event log and artifacts.

Every query for tenant data goes through a scoped selector (ledger/reads/selectors.py) that takes the
workspace; these models only hold the shape and the invariants the database can enforce.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

import orjson
from django.conf import settings
from django.db import NotSupportedError, models
from django.db.models import Q
from django.db.models.fields.json import KeyTransform

from . import clock
from .canonical import PayloadDecoder, without_nul


class PayloadJSONField(models.JSONField):
    """A projection's copy of a payload value: read back through `PayloadDecoder`, so that a
    number reads back as the fold's value on PostgreSQL's jsonb too (1e21, 6.02214076e23).
    A U+0000 in a string (only an imported log has one) is kept as U+FFFD, which jsonb can hold.
    Migrations see a plain JSONField: the decoder changes reads only, not the schema."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("decoder", PayloadDecoder)
        super().__init__(*args, **kwargs)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        # What JSONField's json.loads(value, cls=PayloadDecoder) returns, without making a decoder
        # per value (a third of the time of reading a run's 20,000 steps, issue 33): orjson first,
        # anything it refuses to JSONField's own path (PayloadDecoder's fallback).
        if value.__class__ is str and not isinstance(expression, KeyTransform):
            try:
                return orjson.loads(value)
            except orjson.JSONDecodeError:
                pass
        return super().from_db_value(value, expression, connection)

    def get_prep_value(self, value: Any) -> Any:
        # An imported log's U+0000 as U+FFFD, on both backends (jsonb cannot hold it).
        return super().get_prep_value(without_nul(value))

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        kwargs.pop("decoder", None)
        return name, "django.db.models.JSONField", args, kwargs


class PublicId(models.Expression):
    """A row's public id made by the database as it inserts the row: `prefix` and 32 lowercase hex
    digits of its strong randomness (PostgreSQL's gen_random_uuid(), 122 random bits; SQLite's
    randomblob(16)). Never the row's primary key, which counts every tenant's rows (docs/security.md
    § What ids and cursors reveal). The database, not Python, so that a process of the release
    before, still running while a deploy migrates (deploy/README.md), inserts rows that have one."""

    output_field = models.CharField(max_length=40)
    allowed_default = True  # Django's word that an expression may be a column's DEFAULT
    PREFIX = re.compile(r"[a-z]{1,8}_")

    def __init__(self, prefix: str) -> None:
        if not self.PREFIX.fullmatch(prefix):
            raise ValueError(f"not an id prefix: {prefix!r}")
        super().__init__()
        self.prefix = prefix

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        raise NotSupportedError("public ids are made by PostgreSQL or SQLite")

    # The prefix is written into the SQL, not bound: a column's DEFAULT takes no parameters.
    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return f"('{self.prefix}' || replace(gen_random_uuid()::text, '-', ''))", []

    def as_sqlite(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return f"('{self.prefix}' || lower(hex(randomblob(16))))", []


class Role(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"
    ADMIN = "admin"


ROLE_RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.APPROVER: 2, Role.ADMIN: 3}


class RunStatus(models.TextChoices):
    """A run's status as the fold derives it from the log (docs/design.md §4)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"

    @classmethod
    def finished(cls) -> tuple[RunStatus, RunStatus]:
        """The statuses after which only custom.* events may follow."""
        return (cls.COMPLETED, cls.FAILED)


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Workspace(models.Model):
    # No index of its own: the unique (tenant, slug) constraint below leads with it (migration 0023).
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="workspaces", db_index=False)
    slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    # Extra redaction rules on top of the built-in secret key names (docs/design.md §3).
    redact_keys = models.JSONField(default=list, blank=True)
    redact_value_patterns = models.JSONField(default=list, blank=True)
    # {"provider/modelId": {"input": .., "cachedInput": .., "output": ..}} over the shipped table.
    price_overrides = models.JSONField(default=dict, blank=True)
    # Shared views (share links) hide model inputs and tool arguments: an admin's choice, audited.
    share_hides_inputs = models.BooleanField(default=False)
    # Days a finished run is kept after its last event before `ledger prune` deletes it
    # (ledger/tenancy/retention.py); NULL keeps runs forever. Changed only by retention.set_retention (audited).
    retention_days = models.PositiveIntegerField(null=True, blank=True)
    # Tool names whose every call waits for a human approver before it runs (on top of the tools
    # that declare `approval="required"` themselves): ledger/replay/toolapproval.py.
    approval_tools = models.JSONField(default=list, blank=True)
    # The operator's overrides of the deployment's size limits for this workspace (ledger/limits.py,
    # docs/security.md § Limits); NULL: the setting's default. Changed only by the operator's
    # `ledger limits` (ledger/tenancy/limits_settings.py, audited `limits.changed`), never by a
    # tenant's admin. Loaded with the workspace, so the write path reads them without a query.
    max_events_per_run = models.PositiveIntegerField(null=True, blank=True)
    max_bytes_per_run = models.PositiveBigIntegerField(null=True, blank=True)
    max_events_per_minute_per_key = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="workspace_slug_unique_in_tenant"),
            models.CheckConstraint(
                condition=(Q(max_events_per_run__isnull=True) | Q(max_events_per_run__gte=1))
                & (Q(max_bytes_per_run__isnull=True) | Q(max_bytes_per_run__gte=1))
                & (Q(max_events_per_minute_per_key__isnull=True) | Q(max_events_per_minute_per_key__gte=1)),
                name="workspace_limits_positive",
            ),
            models.CheckConstraint(
                condition=Q(retention_days__isnull=True) | Q(retention_days__gte=1),
                name="workspace_retention_at_least_a_day",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"


class Membership(models.Model):
    # No index of its own: the unique (user, tenant) constraint below leads with it (migration 0023).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships", db_index=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant"),
            models.CheckConstraint(condition=Q(role__in=list(Role.values)), name="membership_role_known"),
        ]

    def allows(self, role: str) -> bool:
        return ROLE_RANK[Role(self.role)] >= ROLE_RANK[Role(role)]


class ApiKey(models.Model):
    SCOPES = ("ingest", "read", "execute")

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, blank=True)
    prefix = models.CharField(max_length=16, unique=True)
    # sha256 of the whole key: the secret is 32 random bytes, so a slow hash buys nothing.
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # When the key last authenticated, to the minute: written at most once a minute per key
    # (tenancy.authenticate_key), not on every request.
    last_used_at = models.DateTimeField(null=True, blank=True)

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


class UsageColumns(models.Model):
    """Usage totals as columns, so reports can aggregate them in SQL.

    The projections' counters and sequence numbers (here and in Run, Event, Step, ToolCall,
    CostEntry, UsageCell) are IntegerField, not PositiveIntegerField: what keeps them is the fold,
    and `ledger verify` proves them equal to it. PositiveIntegerField's `>= 0` CHECK was read
    again by PostgreSQL on every statement that writes its table (the projections' upserts, the
    run's head update): ~40 µs of a single append's ~800 (bench/README.md § Floors, session 11).
    The log's own rule stays a constraint (Event: sequence >= 1), so do the tool gateway's.
    """

    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cached_input_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    # NULL when every call was unpriced, never 0 for "unknown" (docs/design.md §4).
    cost_usd = models.DecimalField(max_digits=24, decimal_places=12, null=True, blank=True, default=0)
    priced_calls = models.IntegerField(default=0)
    unpriced_calls = models.IntegerField(default=0)

    class Meta:
        abstract = True


class Run(UsageColumns):
    """The head row of a run's log, locked by every append, and the run's projection.

    Everything below `pruning` is projected from the log by the fold (ledger/log/projection.py).
    """

    # No index of its own: the unique (workspace, run_id) constraint and both indexes below lead
    # with it (migration 0023).
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="runs", db_index=False)
    run_id = models.CharField(max_length=84)
    created_at = models.DateTimeField(default=clock.recorded_now)
    last_sequence = models.IntegerField(default=0)
    # Run lease with fencing (docs/design.md §3): the token only ever grows.
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.PositiveBigIntegerField(default=0)
    # Set by retention in the same transaction that deletes the run; the database refuses to
    # delete events of any run without it.
    pruning = models.BooleanField(default=False)

    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING)
    workflow_version_id = models.CharField(max_length=200, blank=True)
    label = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    input = PayloadJSONField(null=True, blank=True)
    output = PayloadJSONField(null=True, blank=True)
    output_ref = models.CharField(max_length=200, blank=True)
    error = PayloadJSONField(null=True, blank=True)
    parent_run_id = models.CharField(max_length=84, blank=True)
    root_run_id = models.CharField(max_length=84, blank=True)
    replay_of = models.CharField(max_length=200, blank=True)
    event_count = models.IntegerField(default=0)
    # The bytes of the run's stored canonical payloads (LEDGER_MAX_BYTES_PER_RUN), kept by the write path.
    payload_bytes = models.BigIntegerField(default=0)
    # Where the log was written: "" here (or by any client), "little-workflow" for a run
    # `ledger import-little` brought in, whose log is read by Little Workflow's rules where they
    # differ from ours (docs/operations.md § Importing Little Workflow data). Set when the run's first event is imported.
    imported_from = models.CharField(max_length=32, blank=True, default="")
    # Who appended the run's first batch (its RunStarted), as the server knew the caller: a
    # username (a console session), `key:<prefix>` (an API key, OTLP ingest), or `system:<what>`
    # (the command line, the runtime of a workflow nobody named). Set by the write door
    # (ledger/log `append(by=...)`) in the statement that creates the run's log, never from the
    # payload and never changed after; the "not your own" rule of tool approvals reads it
    # (ledger/replay/toolapproval.py). Not a projection: `ledger rebuild` keeps it, `ledger verify`
    # does not compare it (the log does not hold it). "": not known (migration 0030 filled runs
    # from before it with their RunStarted's claimed `requestedBy`, the best there was).
    started_by = models.CharField(max_length=160, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "run_id"], name="run_id_unique_in_workspace"),
        ]
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="run_newest_first"),
            models.Index(fields=["workspace", "parent_run_id"], name="run_children"),
            # The runs below a root (a root run holds ""): the runs list's tree totals, probed per row
            # (ledger/reads/runlist.py), and a tree's runs (retention). Partial: over every run, the
            # planner could not tell a run's id from the "" of most rows and read the workspace.
            models.Index(fields=["workspace", "root_run_id"], name="run_below", condition=~Q(root_run_id="")),
            # The runs still going: what needs a person is looked for among them (the navigation's
            # Approvals badge on every page, ledger/reads/attention.py), not among every run of the
            # workspace. Small, and its status changes twice in a run's life; with the id, the
            # badge's read of their ids needs no row.
            models.Index(
                fields=["workspace", "id"], name="run_unfinished", condition=~Q(status__in=["completed", "failed"])
            ),
        ]

    def __str__(self) -> str:
        return self.run_id

    @property
    def finished(self) -> bool:
        return self.status in RunStatus.finished()


class InsertOnlyQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> NoReturn:
        raise TypeError("the event log is insert-only")

    def delete(self) -> NoReturn:
        raise TypeError("the event log is insert-only; retention deletes whole runs, never single events")


# The events the run page jumps to (ledger/replay/runlog.first_sequence): a run's failures (StepFailed,
# RunFailed, ParallelBranchFailed, … and harness.session.failed, harness.tool_call.failed, …) and its
# in-doubt tool calls. Each kind has a partial index (event_failures, event_in_doubt below), so
# finding the first of them reads the few such events rather than every event of the run.
EVENT_FAILURE = Q(type__endswith="Failed") | Q(type__endswith=".failed")
EVENT_IN_DOUBT = Q(type="harness.tool_call.in_doubt")


class Event(models.Model):
    # db_index=False: the unique (run, …) constraint below is the index of every run_id lookup;
    # a second index on run_id alone only cost each insert (migration 0012).
    # db_constraint=False, here and on the step, tool call and cost entry rows (migration 0019):
    # these rows are written only by the append's one statement (ledger/log/statements.py), which takes
    # their run_id from the run row it has just inserted or updated, so the reference holds by
    # construction; runs are deleted only by retention, which deletes these rows first. The
    # database's per-row check of it (a deferred trigger, one locking lookup of the run per row)
    # was a third of the statement's server time. `ledger verify` finds any row without its run.
    run = models.ForeignKey(
        Run, on_delete=models.DO_NOTHING, related_name="events", db_constraint=False, db_index=False
    )
    sequence = models.IntegerField()
    event_id = models.CharField(max_length=20)
    type = models.CharField(max_length=200)
    occurrence_id = models.CharField(max_length=200, null=True, blank=True)
    recorded_at = models.DateTimeField()
    # The payload as stored: RFC 8785 canonical JSON text, so event ids recompute byte for byte.
    payload = models.TextField()
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_digest = models.CharField(max_length=71, null=True, blank=True)

    objects = InsertOnlyQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "sequence"], name="event_sequence_unique_in_run"),
            models.UniqueConstraint(
                fields=["run", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="event_idempotency_key_unique_in_run",
            ),
            models.CheckConstraint(condition=Q(sequence__gte=1), name="event_sequence_positive"),
            models.CheckConstraint(
                condition=Q(idempotency_key__isnull=True) | Q(request_digest__isnull=False),
                name="event_idempotency_key_has_digest",
            ),
        ]
        indexes = [
            # Without them the run page's two jumps scanned the run's whole log on every request
            # (65 ms each at 100,000 events); an append pays for them only on the events they hold.
            # Two, not one on either kind: SQLite uses a partial index only for a query that
            # states its very condition. (It does not use event_failures: it matches no LIKE
            # whose pattern is a bound parameter, so there that jump still reads the run's log.)
            models.Index(fields=["run", "sequence"], condition=EVENT_FAILURE, name="event_failures"),
            models.Index(fields=["run", "sequence"], condition=EVENT_IN_DOUBT, name="event_in_doubt"),
        ]

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("events are written only through the log's door, ledger.log.append")

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("the event log is insert-only; retention deletes whole runs, never single events")


class Artifact(models.Model):
    """Content-addressed bytes (sha256) owned by a workspace; re-hashed on every read."""

    # No index of its own: the unique (workspace, sha256) constraint below leads with it (migration 0023).
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="artifacts", db_index=False)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    content_type = models.CharField(max_length=100, default="application/json")
    storage_key = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "sha256"], name="artifact_unique_in_workspace"),
        ]

    @property
    def artifact_id(self) -> str:
        return f"art_{self.sha256}"

    @property
    def ref(self) -> str:
        return f"artifact://{self.artifact_id}"


class ImportedArtifact(models.Model):
    """A ref another system wrote into a log imported as it is (Little Workflow's
    `artifact://art_<16 hex>`, ledger/interop/little_import.py) and the artifact that holds its bytes.

    The events keep the foreign ref, since their ids hash it; this row resolves it, so `ledger
    verify`, the evidence and the replay plan re-hash those bytes like any other artifact's.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="imported_artifacts", db_index=False)
    ref = models.CharField(max_length=200)
    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="imported_as")
    step_path = models.CharField(max_length=500, blank=True)
    name = models.TextField()
    encoding = models.CharField(max_length=16)
    created_at = models.DateTimeField(null=True, blank=True)  # when the other system wrote it
    # The run the other system wrote it in, whose id its artifact id hashes: "" for the row's own
    # run (the import's), the imported run's id for a row a fork copied with the events naming it.
    written_in_run = models.CharField(max_length=84, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "ref"], name="imported_artifact_unique_in_run")]


class Step(UsageColumns):
    """A step of a run, as the fold sees it; ordered by first appearance in the log."""

    # db_index=False: the unique (run, …) constraint below is the index of every run_id lookup;
    # a second index on run_id alone only cost each insert (migration 0012).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="steps", db_index=False, db_constraint=False
    )  # see Event.run
    step_path = models.CharField(max_length=500)
    position = models.IntegerField()
    status = models.CharField(max_length=16)
    visit = models.IntegerField(null=True, blank=True)
    attempts = PayloadJSONField(default=list)
    output = PayloadJSONField(null=True, blank=True)
    has_output = models.BooleanField(default=False)
    output_ref = models.CharField(max_length=200, blank=True)
    artifact_refs = PayloadJSONField(default=list)
    error = PayloadJSONField(null=True, blank=True)
    first_sequence = models.IntegerField()
    last_sequence = models.IntegerField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step_path"], name="step_path_unique_in_run")]
        indexes = [
            # A page of steps is a range of positions (selectors.steps_page): without this index a
            # page of a run of 20,000 steps read all of them (issue 33).
            models.Index(fields=["run", "position"], name="step_position_in_run"),
            # The steps whose retry is scheduled (ledger/reads/attention.py, on every run object,
            # run header and page of the runs list): without it, every step of the runs asked about.
            # On the error column, which a step's failure sets, not on its status, which every
            # step's start and end change: an update that changes neither stays a HOT update.
            models.Index(
                fields=["run", "position"], condition=models.Q(error__has_key="retryAt"), name="step_retry_in_run"
            ),
        ]
        ordering = ["run", "position"]


class FoldSnapshot(models.Model):
    """The fold of a run's first `sequence` events, so that a read folds forward from here instead
    of from event 1 (ledger/log/snapshots.py). A projection: written lazily by reads, deleted with
    its run, thrown away by `ledger rebuild`, compared with the fold of the log by `ledger verify`."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="fold_snapshots", db_index=False)
    sequence = models.IntegerField()
    price_version = models.CharField(max_length=200)
    state = models.BinaryField()  # RunState.to_json(), as orjson bytes

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "price_version", "sequence"], name="fold_snapshot_unique")
        ]


class LogProof(models.Model):
    """That a run's first `sequence` events passed `ledger verify`'s checks (dense sequences, every
    event id recomputed, the projections equal to their fold), recorded once so that the evidence
    bundle checks only the events after it (ledger/log/proofs.py). `digest` chains the stored event
    ids 1..sequence, so `ledger verify` can check the proof itself against the log. Deleted with its
    run and thrown away by `ledger rebuild`."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="log_proof")
    sequence = models.IntegerField()
    last_event_id = models.CharField(max_length=20)
    digest = models.CharField(max_length=64)  # hex sha256 chain over the stored event ids 1..sequence
    refs = models.JSONField(default=list)  # the artifact refs events 1..sequence name
    payload_bytes = models.BigIntegerField()  # of events 1..sequence's stored payloads
    price_version = models.CharField(max_length=200)  # the price table the projections were compared under
    proved_at = models.DateTimeField()


class ToolCall(models.Model):
    """A tool call of a run: the fold's view of it (the gateway adds its lease columns)."""

    # db_index=False: the unique (run, …) constraint below is the index of every run_id lookup;
    # a second index on run_id alone only cost each insert (migration 0012).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="tool_calls", db_index=False, db_constraint=False
    )  # see Event.run
    call_id = models.CharField(max_length=200)
    position = models.IntegerField()
    tool_name = models.CharField(max_length=200, blank=True)
    args = PayloadJSONField(null=True, blank=True)
    caller = models.CharField(max_length=50, blank=True)
    turn = models.IntegerField(null=True, blank=True)
    step_path = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=16)
    result = PayloadJSONField(null=True, blank=True)
    error = PayloadJSONField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    reconciled = models.BooleanField(default=False)
    origin = models.CharField(max_length=16, blank=True)
    started_sequence = models.IntegerField(null=True, blank=True)
    ended_sequence = models.IntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="tool_call_unique_in_run")]
        # A page of the evidence tab's tool calls is a range of positions (selectors.tool_calls_page),
        # as a page of steps is: without it, a late page of 20,000 calls read all of them.
        indexes = [models.Index(fields=["run", "position"], name="tool_call_position_in_run")]
        ordering = ["run", "position"]


class CostEntry(models.Model):
    """One per answered model call: tokens as recorded, dollars as priced by the fold."""

    # db_index=False: the unique (run, …) constraint below is the index of every run_id lookup;
    # a second index on run_id alone only cost each insert (migration 0012).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="cost_entries", db_index=False, db_constraint=False
    )  # see Event.run
    sequence = models.IntegerField()
    call_id = models.CharField(max_length=200, blank=True)
    step_path = models.CharField(max_length=500, blank=True)
    provider = models.CharField(max_length=200, blank=True)
    model_id = models.CharField(max_length=200, blank=True)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cached_input_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=24, decimal_places=12, null=True, blank=True)
    price_table_version = models.CharField(max_length=100)
    # The price table's entry that priced the call (`openai/gpt-4o` for a call to
    # gpt-4o-2024-08-06), "" when unpriced: shown beside the model the call named.
    priced_as = models.CharField(max_length=401, blank=True, default="")
    # False: the call's usage gave no token count (ledger.fold.pricing.reports_tokens), so its
    # cost is NULL whatever its model's price: "usage not reported", not "no price". The database
    # default keeps the previous release's inserts (which name no such column) working mid-deploy.
    usage_reported = models.BooleanField(default=True, db_default=True)
    recorded_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "sequence"], name="cost_entry_unique_in_run")]
        indexes = [models.Index(fields=["recorded_at"], name="cost_entry_by_time")]
        ordering = ["run", "sequence"]


class UsageCell(models.Model):
    """What a usage rollup cell (DailyUsage, MonthlyUsage) sums, and the model and workflow it is of."""

    provider = models.CharField(max_length=200, blank=True)
    model_id = models.CharField(max_length=200, blank=True)
    workflow_version_id = models.CharField(max_length=200, blank=True)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cached_input_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=24, decimal_places=12, default=0)

    class Meta:
        abstract = True


class DailyUsage(UsageCell):
    """The cost entries of one workspace, UTC day, model and workflow, summed: what the usage report
    reads, so that a year's report reads days, not every model call (bench/scale.py).

    Kept in the append transaction of each cost entry (ledger/log/rollup.py), recounted from the cost
    entries by `ledger rebuild`, checked against them by `ledger verify`. `cost_usd` sums the
    priced calls only; a cell whose calls are all unpriced has 0 there and priced_calls 0.
    """

    # No index of its own: the unique constraint below leads with it (migration 0022).
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+", db_index=False)
    day = models.DateField()
    calls = models.IntegerField(default=0)
    priced_calls = models.IntegerField(default=0)

    class Meta:
        constraints = [
            # Also the report's index: every read filters on workspace and a range of days.
            models.UniqueConstraint(
                fields=["workspace", "day", "provider", "model_id", "workflow_version_id"],
                name="daily_usage_cell_unique",
            ),
        ]


class MonthlyUsage(UsageCell):
    """The daily usage rollup summed per calendar month (UTC): what a long usage report reads, so a
    year of a workspace is at most a row per cell and month (bench/scale.py).

    Kept by database triggers on DailyUsage (migration 0018): every insert, update and delete of a
    daily cell adds its difference to the cell's month in the same statement, so every writer of the
    daily rollup (the append's one statement, recounts, retention) keeps it without code of its own.
    `rollup.recount` also counts the months of the days it recounts again from the daily cells, and
    `ledger verify` compares every month with the sum of its days. `month` is the month's first day.
    A cell whose calls drop to none goes. No CHECK on the sums: a trigger adds signed differences.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+", db_index=False)
    month = models.DateField()
    calls = models.BigIntegerField(default=0)
    priced_calls = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            # Also the report's index (the workspace leads it: no index of the foreign key alone).
            models.UniqueConstraint(
                fields=["workspace", "month", "provider", "model_id", "workflow_version_id"],
                name="monthly_usage_cell_unique",
            ),
        ]


class Feedback(models.Model):
    """A member's (or a harness's) rating of a run; listed in the evidence bundle."""

    # `feedbackId`: kept by clients and in exports, so never changed (migration 0040 gave the rows
    # before it theirs). Unique by the constraint below, which makes no LIKE index beside it.
    public_id = models.CharField(max_length=40, db_default=PublicId("fb_"))
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="feedback")
    rating = models.PositiveSmallIntegerField()
    category = models.CharField(max_length=100, blank=True)
    comment = models.TextField(blank=True)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(rating__gte=1) & Q(rating__lte=5), name="feedback_rating_1_to_5"),
            models.UniqueConstraint(fields=["public_id"], name="feedback_public_id_unique"),
        ]
        ordering = ["run", "created_at", "pk"]


class ToolGatewayClaim(models.Model):
    """The tool gateway's control row of one call: identity, lease, outbound stamp and outcome.

    Not a projection: owners, lease tokens and the outbound stamp are not in the log, so `ledger
    rebuild` leaves this table alone. Every change that the log must know about is written in the
    same transaction as its `harness.tool_call.*` event (ledger/replay/gateway.py).
    """

    class Status(models.TextChoices):
        CLAIMED = "claimed"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        IN_DOUBT = "in_doubt"

    class Effect(models.TextChoices):
        READ = "read"
        WRITE = "write"

    # db_index=False: the unique (run, call_id) constraint below is the index of every run_id lookup;
    # a second one on run_id alone was what the generic plan of the gateway's conditions chose,
    # filtering every claim of the run (a cost that grew with the run).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="gateway_claims", db_index=False)
    call_id = models.CharField(max_length=200)
    tool_name = models.CharField(max_length=200)
    args = models.JSONField(null=True, blank=True)  # redacted, as in the log
    # digest({toolName, args}) of the redacted arguments: what "the same call" means for a key.
    args_digest = models.CharField(max_length=71)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    effect = models.CharField(max_length=8, choices=Effect.choices)
    timeout_s = models.FloatField(null=True, blank=True)
    owner = models.CharField(max_length=200)
    lease_token = models.CharField(max_length=64)
    lease_expires_at = models.DateTimeField()
    attempt = models.IntegerField(default=1)
    claimed_at = models.DateTimeField()  # of the current attempt
    outbound_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CLAIMED)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # A result or error over 8 KiB lives in an artifact (ledger/replay/gateway.py wraps it with its run
    # and call, so a cached answer can prove whose it is); `result`/`error` stay NULL then.
    outcome_ref = models.CharField(max_length=200, blank=True)
    outcome_digest = models.CharField(max_length=71, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    reconciled_by = models.CharField(max_length=150, blank=True)
    reconcile_note = models.TextField(blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "call_id"], name="gateway_call_unique_in_run"),
            models.UniqueConstraint(
                fields=["run", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="gateway_idempotency_key_unique_in_run",
            ),
            models.CheckConstraint(
                condition=Q(status__in=["claimed", "succeeded", "failed", "in_doubt"]),
                name="gateway_status_known",
            ),
            models.CheckConstraint(condition=Q(effect__in=["read", "write"]), name="gateway_effect_known"),
            models.CheckConstraint(condition=Q(attempt__gte=1), name="gateway_attempt_positive"),
            models.CheckConstraint(
                condition=Q(status__in=["claimed", "in_doubt"]) | Q(finished_at__isnull=False),
                name="gateway_finished_has_time",
            ),
            models.CheckConstraint(
                condition=~Q(status="in_doubt") | Q(outbound_at__isnull=False),
                name="gateway_in_doubt_went_out",
            ),
        ]
        ordering = ["run", "pk"]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.call_id}"


class ReexecutionRequest(models.Model):
    """A request to re-execute a run (docs/design.md §5, fifth of the replay family) and its decision.

    Not a projection: who asked, who approved and the executor's lease are not in any run's log.
    The original run is named by id, not by foreign key, so retention pruning a run keeps the
    record of what was asked and decided about it.
    """

    class Mode(models.TextChoices):
        SIMULATE = "simulate"
        EVALUATE = "evaluate"
        RESUME = "resume"
        FORK = "fork"
        RERUN = "rerun"

    class Status(models.TextChoices):
        PENDING_APPROVAL = "pending_approval"
        APPROVED = "approved"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        DENIED = "denied"
        EXPIRED = "expired"

        @classmethod
        def started(cls) -> tuple[str, str, str]:
            """The statuses once an executor started the request: its new run exists (before,
            an approved request has only reserved the new run's id)."""
            return (cls.RUNNING, cls.SUCCEEDED, cls.FAILED)

    class Executor(models.TextChoices):
        BUILTIN = "builtin"  # the django-tasks queue and this deployment's runtime
        EXTERNAL = "external"  # a harness claiming through POST /api/v1/reexecutions/claim

    public_id = models.CharField(max_length=40, unique=True)
    # No index of its own: the three indexes below lead with it (migration 0023).
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="reexecutions", db_index=False)
    original_run_id = models.CharField(max_length=84)
    mode = models.CharField(max_length=16, choices=Mode.choices)
    from_step = models.CharField(max_length=500, null=True, blank=True)
    # An input override of null is a value; `has_input` says whether one was given at all.
    has_input = models.BooleanField(default=False)
    input = models.JSONField(null=True, blank=True)
    model_overrides = models.JSONField(default=dict, blank=True)
    # An evaluation's prompt change: step id -> {system?, prompt?} (docs/evaluations.md "Changes").
    prompt_overrides = models.JSONField(default=dict, blank=True)
    # An evaluation's workflow change: the registered workflow (and the version id it had when the
    # request was made) the new run executes instead of the original's. Empty: the original's.
    workflow = models.CharField(max_length=200, blank=True)
    workflow_version = models.CharField(max_length=100, blank=True)
    reason = models.TextField()
    requested_by = models.CharField(max_length=160)  # username, or key:<prefix>
    requested_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_by_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # What the approval binds to: digest({mode, fromStep, input?, modelOverrides, lastSequence, planDigest}).
    digest = models.CharField(max_length=71)
    last_sequence = models.PositiveIntegerField()
    plan_digest = models.CharField(max_length=71)
    status = models.CharField(max_length=20, choices=Status.choices)
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approver_name = models.CharField(max_length=150, blank=True)
    note = models.TextField(blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    new_run_id = models.CharField(max_length=84, blank=True)
    executor = models.CharField(max_length=16, choices=Executor.choices, blank=True)
    batch_id = models.CharField(max_length=40, blank=True, db_index=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_token = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(mode__in=["simulate", "evaluate", "resume", "fork", "rerun"]), name="reexecution_mode_known"
            ),
            models.CheckConstraint(
                condition=Q(
                    status__in=["pending_approval", "approved", "running", "succeeded", "failed", "denied", "expired"]
                ),
                name="reexecution_status_known",
            ),
            models.CheckConstraint(condition=~Q(reason=""), name="reexecution_reason_given"),
            models.CheckConstraint(
                condition=Q(mode="fork", from_step__isnull=False) | Q(~Q(mode="fork"), from_step__isnull=True),
                name="reexecution_from_step_only_for_fork",
            ),
            # Whatever was approved has its run id reserved and knows who executes it.
            models.CheckConstraint(
                condition=Q(status__in=["pending_approval", "denied", "expired"])
                | (~Q(new_run_id="") & ~Q(executor="")),
                name="reexecution_approved_has_run_and_executor",
            ),
        ]
        indexes = [
            models.Index(fields=["workspace", "status", "created_at"], name="reexecution_by_status"),
            models.Index(fields=["workspace", "original_run_id"], name="reexecution_by_run"),
            models.Index(fields=["workspace", "new_run_id"], name="reexecution_by_new_run"),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED, self.Status.DENIED, self.Status.EXPIRED)


class ShareLink(models.Model):
    """A read-only, login-free link to one run's evidence (docs/api.md "Share links").

    The token is shown once, in the URL given to its creator; only its sha256 is kept. The run is
    named by id, not by foreign key (as a re-execution request names its run), so retention
    deleting the run leaves the link's record and its audit trail; the link then answers 410.
    """

    public_id = models.CharField(max_length=40, unique=True)
    # No index of its own: the index by run below leads with it (migration 0023).
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="share_links", db_index=False)
    run_id = models.CharField(max_length=84)
    # sha256 of the token: the token is 32 random bytes, so a slow hash buys nothing (as for API keys).
    token_hash = models.CharField(max_length=64, unique=True)
    include_sub_runs = models.BooleanField(default=False)
    expires_at = models.DateTimeField()
    max_opens = models.PositiveIntegerField(null=True, blank=True)
    open_count = models.PositiveIntegerField(default=0)
    last_opened_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=160)  # a username
    created_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=160, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(max_opens__isnull=True) | Q(max_opens__gte=1, max_opens__lte=10_000),
                name="share_link_max_opens_in_range",
            ),
            # The backstop of the counted open (ledger/tenancy/sharing.py): never one open past the limit.
            models.CheckConstraint(
                condition=Q(max_opens__isnull=True) | Q(open_count__lte=models.F("max_opens")),
                name="share_link_opens_within_max",
            ),
        ]
        indexes = [models.Index(fields=["workspace", "run_id", "created_at"], name="share_link_by_run")]

    def __str__(self) -> str:
        return self.public_id


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> NoReturn:
        raise TypeError("the audit log is append-only")

    def delete(self) -> NoReturn:
        raise TypeError("the audit log is append-only")


class AuditEntry(models.Model):
    """One privileged action, written in the transaction of the action (ledger/audit.py).

    Append-only in code (save of an existing row, delete and queryset update/delete raise) and in
    the database (triggers, ledger/dbguards.py). Actors and targets are strings, not foreign keys:
    an entry outlives the user, key or run it names.
    """

    class Action(models.TextChoices):
        # Stable strings, never renamed (docs/api.md "Audit").
        REEXECUTION_REQUESTED = "reexecution.requested"
        REEXECUTION_APPROVED = "reexecution.approved"
        REEXECUTION_DENIED = "reexecution.denied"
        REEXECUTION_EXPIRED = "reexecution.expired"
        REEXECUTION_CLAIMED = "reexecution.claimed"
        REEXECUTION_STARTED = "reexecution.started"
        REEXECUTION_FINISHED = "reexecution.finished"
        TOOL_CALL_RECONCILED = "tool_call.reconciled"
        API_KEY_CREATED = "api_key.created"
        API_KEY_REVOKED = "api_key.revoked"
        MEMBER_ADDED = "member.added"
        MEMBER_CHANGED = "member.changed"
        MEMBER_REMOVED = "member.removed"
        MEMBER_PASSWORD_RESET = "member.password_reset"
        MEMBER_ACCOUNT_DISABLED = "member.account_disabled"
        MEMBER_ACCOUNT_ENABLED = "member.account_enabled"
        RETENTION_CHANGED = "retention.changed"
        LIMITS_CHANGED = "limits.changed"
        SHARE_LINK_CREATED = "share_link.created"
        SHARE_LINK_REVOKED = "share_link.revoked"
        SHARE_LINK_OPENED = "share_link.opened"
        SHARE_POLICY_CHANGED = "share_policy.changed"
        RUN_PRUNED = "run.pruned"
        REDACTION_CHANGED = "redaction.changed"
        RUN_OTLP_EXPORTED = "run.otlp_exported"
        EXPORT_DOWNLOADED = "export.downloaded"
        EVIDENCE_BUNDLE_DOWNLOADED = "evidence_bundle.downloaded"
        RUN_CANCELLED = "run.cancelled"
        TOOL_CALL_APPROVED = "tool_call.approved"
        TOOL_CALL_REJECTED = "tool_call.rejected"
        DATASET_CHANGED = "dataset.changed"
        EVALUATION_POLICY_APPROVED = "evaluation_policy.approved"
        EVALUATION_POLICY_REVOKED = "evaluation_policy.revoked"
        EVALUATION_STARTED = "evaluation.started"
        EVALUATION_FINISHED = "evaluation.finished"
        PRICE_OVERRIDES_CHANGED = "price_overrides.changed"
        PRICES_REPRICE_REQUESTED = "prices.reprice_requested"
        PRICES_REPRICED = "prices.repriced"
        PRICES_REPRICE_FAILED = "prices.reprice_failed"

    # The entry's `id` in the API and exports, never changed (migration 0040 gave the entries
    # before it theirs). Unique by the constraint below, which makes no LIKE index beside it.
    public_id = models.CharField(max_length=40, db_default=PublicId("aud_"))
    # No index of its own: both indexes below lead with it (migration 0023).
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    workspace = models.ForeignKey(Workspace, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    actor = models.CharField(max_length=160)  # username, key:<prefix>, or system:<what>
    actor_user_id = models.BigIntegerField(null=True, blank=True)
    action = models.CharField(max_length=40, choices=Action.choices)
    target = models.CharField(max_length=300)
    reason = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    objects = AuditQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(actor=""), name="audit_actor_given"),
            models.CheckConstraint(condition=~Q(action=""), name="audit_action_given"),
            models.UniqueConstraint(fields=["public_id"], name="audit_public_id_unique"),
        ]
        indexes = [
            models.Index(fields=["tenant", "at", "id"], name="audit_by_time"),
            models.Index(fields=["tenant", "action", "at"], name="audit_by_action"),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise TypeError("the audit log is append-only: an entry is never changed")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("the audit log is append-only")


# --- regression evaluations (ledger/evaluation, docs/evaluations.md) ------------------------------


class Dataset(models.Model):
    """A named set of recorded runs of a workspace; its content is in its versions, each frozen."""

    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="datasets", db_index=False)
    name = models.CharField(max_length=100)
    created_by = models.CharField(max_length=160)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="dataset_name_unique_in_workspace")]

    def __str__(self) -> str:
        return self.name


class DatasetVersion(models.Model):
    """One frozen content of a dataset: `members` is [{runId, lastSequence, expected?}] in run id
    order, `digest` is digest(members); a change to the dataset makes the next version."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions", db_index=False)
    number = models.PositiveIntegerField()
    members = models.JSONField(default=list)
    digest = models.CharField(max_length=71)
    created_by = models.CharField(max_length=160)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "number"], name="dataset_version_unique")]


class EvaluationPolicy(models.Model):
    """An approver's standing approval of evaluations of one dataset: which kinds of change, which
    scorers, a spend ceiling per evaluation and per UTC day, an expiry; bound to its digest."""

    public_id = models.CharField(max_length=40, unique=True)
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="+", db_index=False)
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="policies")
    change_kinds = models.JSONField(default=list)
    scorers = models.JSONField(default=list)
    ceiling_per_evaluation_usd = models.DecimalField(max_digits=24, decimal_places=12)
    ceiling_per_day_usd = models.DecimalField(max_digits=24, decimal_places=12)
    expires_at = models.DateTimeField()
    digest = models.CharField(max_length=71)
    note = models.TextField(blank=True)
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    approved_by_name = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "dataset"], name="evaluation_policy_by_dataset")]


class Evaluation(models.Model):
    """A change evaluated against a dataset version: an `evaluate` batch of re-executions
    (`batch_id`), scored, reported and judged (`verdict`)."""

    class Status(models.TextChoices):
        PENDING_APPROVAL = "pending_approval"
        RUNNING = "running"
        FINISHED = "finished"
        DENIED = "denied"
        EXPIRED = "expired"

    class Verdict(models.TextChoices):
        NONE = ""
        PASSED = "passed"
        FAILED = "failed"
        BUDGET_EXHAUSTED = "budget_exhausted"
        INCOMPLETE = "incomplete"

    public_id = models.CharField(max_length=40, unique=True)
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="+", db_index=False)
    dataset_version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT, related_name="evaluations")
    change = models.JSONField(default=dict)
    scorers = models.JSONField(default=list)
    fail_if = models.CharField(max_length=500, blank=True)
    policy = models.ForeignKey(
        EvaluationPolicy, null=True, blank=True, on_delete=models.PROTECT, related_name="evaluations"
    )
    ceiling_usd = models.DecimalField(max_digits=24, decimal_places=12, null=True, blank=True)
    batch_id = models.CharField(max_length=40, db_index=True)
    status = models.CharField(max_length=20, choices=Status.choices)
    verdict = models.CharField(max_length=20, choices=Verdict.choices, blank=True, default="")
    budget_exhausted = models.BooleanField(default=False)
    # Why the ceiling stopped it, the first time it did: {code, message} (budget.Stop); null before.
    budget_reason = models.JSONField(null=True, blank=True)
    # {newRunId: {scorer name: {value, passed, reason}}}: what was appended to each new run.
    scores = models.JSONField(default=dict, blank=True)
    grader_cost_usd = models.DecimalField(max_digits=24, decimal_places=12, default=0)
    # Its scorers' model calls whose cost is unknown (no price, no usage reported, or failed after
    # the request left): not in the dollars above, and why its ceilings can no longer be kept (budget.py).
    grader_unpriced_calls = models.IntegerField(default=0)
    report = models.JSONField(null=True, blank=True)
    reason = models.TextField()
    requested_by = models.CharField(max_length=160)
    requested_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "-created_at"], name="evaluation_newest_first")]


class RepriceRequest(models.Model):
    """An admin's request to reprice one workspace's recorded costs (ledger/tenancy/repricing.py),
    worked through by `ledger worker` run by run, in run order: `after_run_pk` is where it stands
    (the last run done), so a task that stopped is taken up there; a run already priced with the
    table in force is left alone, so going over a run again changes nothing. At most one open
    (queued or running) request per workspace. Not a projection: who asked is in no log."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"  # a run could not be repriced: `failure` says which and why

    OPEN = (Status.QUEUED, Status.RUNNING)

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+", db_index=False)
    requested_by = models.CharField(max_length=160)  # the audit actor's name
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    requested_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    touched_at = models.DateTimeField()  # the last progress: a request left still is queued again
    after_run_pk = models.BigIntegerField(default=0)
    runs = models.IntegerField(default=0)  # runs looked at
    runs_changed = models.IntegerField(default=0)
    entries_changed = models.IntegerField(default=0)
    failure = models.TextField(blank=True)  # why it failed (status failed); empty otherwise
    # Times the workspace's prices changed while it was open: each sends it over the runs again
    # from the first (`after_run_pk` 0), and a task of an earlier pass stops.
    restarts = models.IntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["workspace", "-requested_at"], name="reprice_request_latest")]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace"],
                condition=models.Q(status__in=["queued", "running"]),
                name="reprice_request_one_open",
            )
        ]
