/* The run page's step panel: a click (or Enter / Space) on a waterfall bar or a journal row opens the step's
 * attempts below the waterfall (htmx GET of /runs/<id>/steps/<step_id>/, runs.step_pages), and the address
 * gets #step-<step_id> so it can be sent to a colleague; opening /runs/<id>/#step-<step_id> opens it on load.
 * The bars and rows are made focusable here (the waterfall's HTML stays runs.waterfall's); without JavaScript the
 * panel is a page of its own at the same address.
 */
(function () {
  "use strict";

  const PANEL = "step-panel";
  const SHEET = document.currentScript?.dataset.css; // the panel's stylesheet, named by the script's tag
  const HASH = "#step-";
  let opener = null; // the bar or row that opened the panel: focus goes back to it on close
  let focusPending = false; // the panel just asked for gets the focus once it is in (not after a "load all")

  function pageRun() {
    const match = location.pathname.match(/^\/runs\/([0-9a-f-]{36})\/$/);
    return match ? match[1] : null;
  }

  function panel() {
    let section = document.getElementById(PANEL);
    if (!section) {
      section = document.createElement("section");
      section.id = PANEL;
      section.hidden = true;
      const after = document.getElementById("waterfall-card");
      if (!after) return null;
      after.after(section);
    }
    return section;
  }

  function open(runId, stepId, { remember = true } = {}) {
    if (!runId || !stepId || !panel() || !window.htmx) return;
    const url = `/runs/${runId}/steps/${encodeURIComponent(stepId)}/`;
    if (remember && runId === pageRun()) history.replaceState(null, "", HASH + stepId);
    focusPending = true;
    htmx.ajax("GET", url, { target: `#${PANEL}`, swap: "outerHTML" });
  }

  function close() {
    focusPending = false;
    const section = document.getElementById(PANEL);
    if (section) {
      const empty = document.createElement("section");
      empty.id = PANEL;
      empty.hidden = true;
      section.replaceWith(empty);
    }
    if (location.hash.startsWith(HASH)) history.replaceState(null, "", location.pathname + location.search);
    if (opener && document.contains(opener)) opener.focus();
  }

  /* What a bar or a journal row is about: [run id, step id], or null. */
  function stepOf(element) {
    const bar = element.closest("#waterfall .wf-bar");
    if (bar) {
      const label = bar.closest(".wf-row")?.querySelector(".wf-label > .mono");
      const nested = bar.closest('.waterfall[id^="waterfall-"]'); // a child run's waterfall nested in a row
      const runId = nested ? nested.id.slice("waterfall-".length) : pageRun();
      return label ? [runId, label.textContent.trim()] : null;
    }
    const row = element.closest("#journal-rows tr.ev");
    if (row && row.dataset.step && !element.closest("td.payload")) return [pageRun(), row.dataset.step];
    return null;
  }

  /* Bars and rows that open the panel: focusable, named, and marked (new ones arrive with every refresh). */
  function enhance() {
    for (const bar of document.querySelectorAll("#waterfall .wf-bar:not([data-step-panel])")) {
      const found = stepOf(bar);
      if (!found) continue;
      bar.dataset.stepPanel = found[1];
      bar.tabIndex = 0;
      bar.setAttribute("role", "button");
      bar.setAttribute("aria-label", `open step ${found[1]}: ${bar.getAttribute("title") || ""}`.trim());
    }
    for (const row of document.querySelectorAll("#journal-rows tr.ev:not([data-step])")) {
      const cell = row.children[3];
      const stepId = cell ? cell.textContent.trim() : "";
      row.dataset.step = stepId;
      if (!stepId || cell.querySelector("button")) continue;
      const button = document.createElement("button");
      button.type = "button";
      button.className = "sp-button";
      button.textContent = stepId;
      button.setAttribute("aria-label", `open step ${stepId}`);
      cell.replaceChildren(button);
    }
  }

  document.addEventListener("click", (event) => {
    if (event.target.closest("[data-step-panel-close]")) {
      event.preventDefault();
      close();
      return;
    }
    if (event.target.closest("a, summary, details[open] pre")) return; // links and payload folds keep their own
    const found = stepOf(event.target);
    if (!found) return;
    opener = event.target.closest(".wf-bar, tr.ev button, tr.ev") || null;
    open(found[0], found[1]);
  });

  document.addEventListener("keydown", (event) => {
    const shown = document.getElementById(PANEL);
    // Escape closes the panel from inside it, and also from the bar or row that opened it while the panel is still
    // taking the focus (htmx settles it a moment after it appears).
    const fromPanel = shown && !shown.hidden && (shown.contains(document.activeElement) || document.activeElement === opener);
    if (event.key === "Escape" && fromPanel) {
      close();
      return;
    }
    if ((event.key === "Enter" || event.key === " ") && event.target.matches?.("#waterfall .wf-bar[data-step-panel]")) {
      event.preventDefault();
      opener = event.target;
      open(stepOf(event.target)?.[0], event.target.dataset.stepPanel);
    }
  });

  document.addEventListener("htmx:afterSettle", () => {
    enhance();
    const section = document.getElementById(PANEL);
    if (focusPending && section && !section.hidden) {
      focusPending = false;
      section.focus({ preventScroll: true });
      section.scrollIntoView({ block: "nearest" });
    }
  });

  function fromHash() {
    if (!location.hash.startsWith(HASH)) return;
    const stepId = decodeURIComponent(location.hash.slice(HASH.length));
    open(pageRun(), stepId, { remember: false });
  }

  window.addEventListener("hashchange", fromHash);

  function start() {
    if (SHEET && !document.querySelector(`link[href="${SHEET}"]`)) {
      const link = document.createElement("link");
      link.rel = "stylesheet";
      link.href = SHEET;
      document.head.appendChild(link);
    }
    enhance();
    // The live journal appends rows without htmx (pal.js): mark them as they come.
    const rows = document.getElementById("journal-rows");
    if (rows) new MutationObserver(enhance).observe(rows, { childList: true });
    setTimeout(fromHash, 0); // after htmx has started on this page too
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
