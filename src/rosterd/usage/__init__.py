"""What each key used, per role, kept in the state folder (DESIGN.md layer 5): requests,
prompt and completion tokens, errors, queue wait and time served, in hourly buckets of an
SQLite database (:mod:`rosterd.usage.store`)."""

from __future__ import annotations

from rosterd.usage.store import USAGE_FIELDS, UsageStore, parse_since

__all__ = ["USAGE_FIELDS", "UsageStore", "parse_since"]
