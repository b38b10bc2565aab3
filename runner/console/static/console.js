// Live updates without reloading by hand: a page names what it watches (data-poll); when that
// changes, the page reloads. No author content is ever handled here: only status words and
// numbers from the console's own JSON.
"use strict";
(function () {
  const body = document.body;
  const url = body.dataset.poll;
  if (!url) return;
  let last = null;
  async function poll() {
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } });
      if (response.ok) {
        const data = await response.json();
        const seen = JSON.stringify(body.dataset.watch === "counts" ? data.counts : [data.status, data.updated]);
        if (last !== null && seen !== last) location.reload();
        last = seen;
      }
    } catch (error) {
      // the console is restarting or the network dropped: try again at the next tick
    }
    setTimeout(poll, 2000);
  }
  poll();
})();
