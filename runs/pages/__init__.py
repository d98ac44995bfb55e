"""The operator's pages (docs/reference/pages.md): server-rendered templates that htmx enhances."""

# Each page view renders the whole page or, for an htmx request, only the fragment its target names
# (request.htmx.target): one address serves the page and its live parts, and everything reads without
# JavaScript. Reads go through runs.selectors and journal.selectors, every change through runs.services, as in
# the REST API and the admin. Reading needs runs.view_run (or runs.operate); every action needs runs.operate
# and a CSRF token (htmx sends it from hx-headers on <body>): access holds those checks, waterfall the
# waterfall's layout, formatting (and the runs_pages template filters) how durations, times and JSON read.
# One module a page: run_list (and bulk actions), run, ops, step, workflow, schedule, compare, fork, flow, pauses,
# reruns.
