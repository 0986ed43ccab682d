"""OpenTelemetry interop (docs/otlp.md): OTLP/HTTP trace ingest (`ingest`) and a run exported as
OTLP/JSON spans (`export`), both along the OpenTelemetry GenAI semantic conventions."""
