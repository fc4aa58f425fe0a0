"""The event log (`log`: every name; `rows`, `reader`, `writer`, `apply`) and the
re-materialization of purged cohorts in event time during a replay (`rebuilds`)."""
