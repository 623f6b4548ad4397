"""Traces: one OpenTelemetry span per request, its upstream attempts and its settlement,
exported over OTLP/HTTP when `[telemetry] otlp_endpoint` is set (decisions.md, "Operators
(wave 3)"). Only `hooks` is imported by the rest of the gateway; the modules that import
OpenTelemetry are imported when tracing is on, never otherwise."""
