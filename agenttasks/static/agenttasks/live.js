// The admin's task page, live: it follows the task's conversation event stream (the operator's
// session) and, after each event, re-reads the page and swaps in the parts that changed — the
// status badge, the progress line, the timeline, pending actions with their forms, the runs.
// The change list refreshes the status and progress of the rows on screen every few seconds.
(function () {
  "use strict";
  const list = document.querySelector("[data-live-poll]");
  if (!list || !window.fetch) return;
  const cells = list.dataset.liveCells.split(" ");
  const key = (row) => (row.querySelector("input.action-select") || {}).value;

  async function poll() {
    try {
      const response = await fetch(window.location.href, {credentials: "same-origin"});
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = new Map();
      for (const row of page.querySelectorAll("#result_list tbody tr")) fresh.set(key(row), row);
      for (const row of document.querySelectorAll("#result_list tbody tr")) {
        const other = fresh.get(key(row));
        if (!other) continue;
        for (const name of cells) {
          const cell = row.querySelector("." + name);
          const now = other.querySelector("." + name);
          if (cell && now && cell.innerHTML !== now.innerHTML) cell.innerHTML = now.innerHTML;
        }
      }
      list.dataset.liveRefreshed = String(Number(list.dataset.liveRefreshed || 0) + 1);
    } catch (error) {
      // The next poll tries again.
    }
  }

  setInterval(poll, Number(list.dataset.livePoll) * 1000);
})();

(function () {
  "use strict";
  const root = document.querySelector("[data-live-stream]");
  if (!root || !window.EventSource || !window.fetch) return;
  const parts = root.dataset.liveParts.split(" ");
  // Every event type the log has (docs/rest.md#event-types); a named event needs its listener.
  const TYPES = [
    "snapshot", "message.user", "message.assistant", "tool.call", "tool.result",
    "action.requested", "action.resolved", "task.status", "task.progress", "task.notification",
    "task.delegated", "task.escalated", "task.reattached", "callback.delivered",
    "callback.failed", "run.started", "run.finished",
  ];
  let timer = null;
  let running = false;
  let again = false;

  function busy(part) {
    // Never replace what the operator is typing into or has just ticked.
    const active = document.activeElement;
    return active && part.contains(active) && active.matches("input, textarea, select");
  }

  async function refresh() {
    if (running) { again = true; return; }
    running = true;
    try {
      const response = await fetch(window.location.href, {credentials: "same-origin"});
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const id of parts) {
        const fresh = page.getElementById(id);
        const current = document.getElementById(id);
        if (!fresh || !current || busy(current)) continue;
        if (fresh.innerHTML !== current.innerHTML || fresh.className !== current.className) {
          current.replaceWith(document.importNode(fresh, true));
        }
      }
      root.dataset.liveRefreshed = String(Number(root.dataset.liveRefreshed || 0) + 1);
    } catch (error) {
      // The next event tries again.
    } finally {
      running = false;
      if (again) { again = false; schedule(); }
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 150);  // one refresh for a burst of events
  }

  function follow() {
    const source = new EventSource(root.dataset.liveStream, {withCredentials: true});
    for (const type of TYPES) source.addEventListener(type, schedule);
    source.addEventListener("open", function () { root.dataset.liveConnected = "1"; });
    // The server closes a stream after STREAM_MAX_SECONDS; EventSource reconnects by itself.
  }

  follow();
})();
