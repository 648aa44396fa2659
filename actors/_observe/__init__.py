"""Observability: the runtime-wide event feed, OpenTelemetry traces and metrics, timelines."""
