"""Telemetry: metrics, traces, the worker's health endpoints and `qjsflow doctor`."""
