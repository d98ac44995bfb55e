/* PAL Ops pages: the few things htmx does not do by itself.
 * - the run page's journal follows the run live over server-sent events (/runs/<id>/events/stream) and tells
 *   the page's fragments that the run moved (pal:journal on every event, pal:status when its status may change);
 * - lease countdowns tick every second (from the server's clock, not the browser's);
 * - refusals that htmx does not swap (403, 5xx, no answer) show in the flash bar;
 * - "tick all" on the run list;
 * - the inbox's list refreshes itself while nobody is deciding in it.
 * Everything here is an enhancement: every page reads the same without JavaScript.
 */
(function () {
  "use strict";

  const FINAL = new Set(["run_succeeded", "run_failed", "run_cancelled"]);
  // Kinds after which the run's status, its pending approvals or its available actions may differ.
  const STATUS_KINDS = new Set([
    "run_started", "run_waiting", "run_resumed", "run_retried", "run_redriven", "approval_requested",
    "approval_decided", "signal_received", "child_created", "run_succeeded", "run_failed", "run_cancelled",
  ]);

  // --- the page's live events ----------------------------------------------------------------------
  // htmx's trigger filters (`event[cond()]`) need eval, which the Content-Security-Policy forbids: the
  // fragments listen instead to events sent here only when they may refresh.

  /* The actions panel refreshes itself when the run's status moves, unless the operator is typing in it. */
  function actionsIdle() {
    const panel = document.getElementById("run-actions");
    if (!panel) return true;
    if (panel.querySelector("details[open]")) return false;
    for (const field of panel.querySelectorAll("input[type=text], textarea")) {
      if (field.value.trim() || field === document.activeElement) return false;
    }
    return true;
  }

  /* The waterfall refreshes as the run moves, unless a nested child waterfall or a fold of items is open (it
     would fold). */
  function waterfallIdle() {
    return !document.querySelector("#waterfall details[open]");
  }

  /* The run moved: pal:journal (the header), pal:waterfall (the waterfall, when idle), and when its status may
     have changed pal:status (the receipt) and pal:actions (the actions panel, when idle). */
  function moved(detail, statusMayChange) {
    htmx.trigger(document.body, "pal:journal", detail);
    if (waterfallIdle()) htmx.trigger(document.body, "pal:waterfall", detail);
    if (!statusMayChange) return;
    htmx.trigger(document.body, "pal:status", detail);
    if (actionsIdle()) htmx.trigger(document.body, "pal:actions", detail);
  }

  // --- the inbox ------------------------------------------------------------------------------------
  // The inbox's list refreshes itself every INBOX_EVERY ms, unless someone is deciding in it (a field has the
  // focus or holds text, a select was changed): a refresh would take their answer away.

  const INBOX_EVERY = 5000;
  function inboxIdle(list) {
    if (list.contains(document.activeElement) && document.activeElement !== list) return false;
    for (const field of list.querySelectorAll("input[type=text], input[type=number], textarea")) {
      if (field.value.trim() && field.value !== field.defaultValue) return false;
    }
    for (const box of list.querySelectorAll("input[type=checkbox]")) {
      if (box.checked !== box.defaultChecked) return false;
    }
    for (const select of list.querySelectorAll("select")) {
      for (const option of select.options) if (option.selected !== option.defaultSelected) return false;
    }
    return true;
  }
  function inboxTick() {
    const list = document.getElementById("inbox-list");
    if (list && !document.hidden && inboxIdle(list)) htmx.trigger(list, "pal:inbox");
  }

  // --- places on the waterfall's tracks ----------------------------------------------------------------
  // A mark's place is in data-l / data-w / data-r (percent of its track), never a style attribute (the CSP
  // allows none): pal.css reads them with attr(); where the browser cannot, they are set here.

  const PLACES = [["l", "left"], ["w", "width"], ["r", "right"]];
  const CSS_PLACES = window.CSS?.supports?.("left", "attr(data-l %, 0%)");
  function place(root) {
    if (CSS_PLACES || !root.querySelectorAll) return;
    for (const [key, property] of PLACES) {
      for (const el of root.querySelectorAll(`[data-${key}]`)) el.style[property] = `${el.dataset[key]}%`;
    }
  }
  document.addEventListener("htmx:load", (event) => place(event.detail.elt));

  // --- flash bar -----------------------------------------------------------------------------------

  function flash(text) {
    const bar = document.getElementById("flash");
    if (!bar) return;
    bar.textContent = text;
    bar.hidden = false;
    clearTimeout(flash.timer);
    flash.timer = setTimeout(() => { bar.hidden = true; }, 12000);
  }

  document.addEventListener("htmx:responseError", (event) => {
    const xhr = event.detail.xhr;
    const type = xhr.getResponseHeader("Content-Type") || "";
    let text = `Refused (HTTP ${xhr.status}).`;
    if (type.startsWith("text/plain") && xhr.responseText) text = xhr.responseText.slice(0, 400);
    else if (xhr.status >= 500) text = `The server failed (HTTP ${xhr.status}); the action may not have happened. Reload and look.`;
    flash(text);
  });
  document.addEventListener("htmx:sendError", () => flash("The server did not answer. Is it up?"));
  document.addEventListener("click", (event) => {
    if (event.target.id === "flash") event.target.hidden = true;
  });

  // --- lease countdowns ----------------------------------------------------------------------------

  const seen = new WeakMap(); // countdown element -> browser time when first seen
  function tick() {
    for (const el of document.querySelectorAll(".countdown[data-expires]")) {
      if (!seen.has(el)) seen.set(el, Date.now());
      const serverNow = Date.parse(el.dataset.now || "") || seen.get(el);
      const left = (Date.parse(el.dataset.expires) - serverNow - (Date.now() - seen.get(el))) / 1000;
      el.textContent = left >= 0 ? `expires in ${left.toFixed(0)}s` : `expired ${(-left).toFixed(0)}s ago`;
      el.classList.toggle("expired", left < 0);
    }
  }

  // --- the live journal ----------------------------------------------------------------------------

  let source = null;

  function clock(iso) {
    const when = new Date(iso);
    return isNaN(when) ? "" : when.toISOString().slice(11, 23);
  }

  function compact(value) {
    const text = JSON.stringify(value === undefined ? null : value);
    return text.length <= 140 ? text : text.slice(0, 139) + "…";
  }

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  function append(event) {
    const table = document.getElementById("journal-table");
    const body = document.getElementById("journal-rows");
    if (!table || !body || event.seq <= Number(table.dataset.lastSeq || 0)) return;
    const scroller = table.closest(".journal-scroll");
    const pinned = scroller && scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
    body.querySelector(".empty-row")?.remove();
    const row = document.createElement("tr");
    row.className = `ev k-${event.kind} fresh`;
    row.dataset.seq = event.seq;
    cell(row, String(event.seq), "seq");
    cell(row, clock(event.created_at), "at").title = event.created_at;
    cell(row, event.kind, "kind");
    cell(row, event.step_id || "", "mono");
    cell(row, event.attempt == null ? "" : String(event.attempt));
    const payload = cell(row, "", "payload");
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    summary.textContent = compact(event.payload);
    const pre = document.createElement("pre");
    pre.className = "json";
    pre.textContent = JSON.stringify(event.payload, null, 2);
    details.append(summary, pre);
    payload.appendChild(details);
    body.appendChild(row);
    table.dataset.lastSeq = String(event.seq);
    if (pinned) scroller.scrollTop = scroller.scrollHeight;
  }

  function setLive(text) {
    const label = document.getElementById("journal-live");
    if (label) label.textContent = text;
  }

  function disconnect(text) {
    if (source) source.close();
    source = null;
    setLive(text);
  }

  function connect() {
    const table = document.getElementById("journal-table");
    const header = document.getElementById("run-header");
    if (source || !table || !header || table.dataset.latest !== "1" || header.dataset.live !== "1") return;
    if (!window.EventSource) return;
    // A reconnect (EventSource does it by itself) sends Last-Event-ID, which the server prefers to after_seq.
    source = new EventSource(`${table.dataset.stream}?after_seq=${table.dataset.lastSeq || 0}`);
    setLive("connecting…");
    source.onmessage = (message) => {
      let event;
      try { event = JSON.parse(message.data); } catch (_) { return; }
      append(event);
      moved({ seq: event.seq, kind: event.kind }, STATUS_KINDS.has(event.kind));
      if (FINAL.has(event.kind)) {
        // The header and the waterfall refresh on journal events at most every 750 ms and 1 s (throttle), dropping
        // the ones in between: once more after those windows, so the run's ending always reaches them.
        setTimeout(() => moved({ seq: event.seq }, false), 1100);
        disconnect(`the run has ended (${event.kind.replace("run_", "")})`);
      }
    };
    source.onerror = () => {
      if (!source || source.readyState !== EventSource.CLOSED) { setLive("reconnecting…"); return; }
      // Closed for good: the server answered 204 (the run is over and we have every event) or refused.
      // A header swapped in from a request that left before the run ended can still say it is live: the journal's
      // last row says better whether the run has ended.
      const status = document.getElementById("run-header")?.dataset.status || "";
      const last = document.querySelector("#journal-rows tr.ev:last-child");
      const ending = [...FINAL].find((kind) => last?.classList.contains(`k-${kind}`));
      const ended = ["succeeded", "failed", "cancelled"].includes(status) ? status : ending?.replace("run_", "");
      disconnect(ended ? `the run has ended (${ended})` : "live stream closed; reload to follow");
    };
    source.onopen = () => setLive("following live");
  }

  // --- wiring ---------------------------------------------------------------------------------------

  document.addEventListener("change", (event) => {
    if (event.target.id === "tick-all") {
      for (const box of document.querySelectorAll("input[name=ids]")) box.checked = event.target.checked;
    }
  });

  // Folding a nested child waterfall or a step's items lets the run's waterfall catch up with what it skipped
  // while open.
  document.addEventListener("toggle", (event) => {
    if (event.target.matches?.("#waterfall details.wf-child, #waterfall details.wf-items") && !event.target.open) {
      moved({}, false);
    }
  }, true);

  // A header swapped in after a retry or a re-drive says the run is live again: follow it again.
  document.addEventListener("htmx:afterSettle", connect);
  document.addEventListener("htmx:oobAfterSwap", () => setTimeout(connect, 0));

  function start() {
    const scroller = document.querySelector(".journal-scroll");
    if (scroller && !location.hash) scroller.scrollTop = scroller.scrollHeight;
    place(document);
    tick();
    setInterval(tick, 1000);
    if (document.getElementById("inbox-list")) setInterval(inboxTick, INBOX_EVERY);
    connect();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
