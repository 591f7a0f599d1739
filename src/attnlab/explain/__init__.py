"""Explanations: the guided tour, the trace recorder, heatmaps and the report."""

from attnlab.explain.trace import Recorder, TraceStep, record

__all__ = ["Recorder", "TraceStep", "record"]
