// Run page: while the run is queued or running, poll its status and progress; reload when it ends.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || live.dataset.finished === "true") return;
  var id = live.dataset.runId;
  var statusEl = document.getElementById("run-status");
  var progressEl = document.getElementById("run-progress");
  var bar = document.getElementById("run-progress-bar");
  var errorEl = document.getElementById("run-error");
  var delay = 1000;

  function badge(status) {
    var span = document.createElement("span");
    span.className = "badge status-" + status;
    span.textContent = status;
    return span;
  }

  function render(s) {
    statusEl.replaceChildren(badge(s.status));
    var p = s.progress;
    if (p) {
      var text = (p.phase || "") + " · step " + (p.step != null ? p.step : "?") + " of " + (p.steps != null ? p.steps : "?");
      if (p.loss != null) text += " · loss " + Number(p.loss).toFixed(4);
      progressEl.textContent = text;
      if (bar && p.steps) { bar.max = p.steps; bar.value = p.step || 0; }
    } else if (s.status === "queued") {
      progressEl.textContent = s.scheduler ? "waiting for Slurm…" : "waiting for a worker…";
    }
    var scheduler = document.getElementById("run-scheduler");
    if (scheduler && s.scheduler) scheduler.textContent = s.scheduler;
    if (s.error) { errorEl.textContent = s.error; errorEl.hidden = false; }
  }

  function poll() {
    fetch("/runs/" + encodeURIComponent(id) + "/status.json", { headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (s) {
        render(s);
        if (s.finished) { window.location.reload(); return; }
        delay = 1000;
        setTimeout(poll, delay);
      })
      .catch(function () { delay = Math.min(delay * 2, 10000); setTimeout(poll, delay); });
  }
  setTimeout(poll, delay);
})();
