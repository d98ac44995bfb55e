"""The REST API (docs/reference/api.md), mounted under /api/v1 by pal.api: one router a module.

runs (the run calls, health, the receipt key), workflows and schedules read through runs.selectors and change state
through runs.services, like the pages and the admin; schemas and receipt_schemas hold their bodies.
"""
