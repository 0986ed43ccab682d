"""What crosses the product's edge: OTLP, exports, evidence bundles, Little Workflow imports."""
