// Run page: while the run is queued or running, poll its status; show the phase, the live chart
// (Plotly JSON built by the server) and the log's tail; reload when it ends.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || live.dataset.finished === "true") return;
  var id = live.dataset.runId;
  var statusEl = document.getElementById("run-status");
  var progressEl = document.getElementById("run-progress");
  var bar = document.getElementById("run-progress-bar");
  var errorEl = document.getElementById("run-error");
  var startedEl = document.getElementById("run-started");
  var phasesEl = document.getElementById("run-phases");
  var chartEl = document.getElementById("chart-live");
  var logEl = document.getElementById("run-log");
  var delay = 1000;

  function badge(status) {
    var span = document.createElement("span");
    span.className = "badge status-" + status;
    span.textContent = status;
    return span;
  }

  function renderPhases(p) {
    if (!phasesEl) return;
    var seen = (p && p.phases) || [];
    phasesEl.querySelectorAll("li").forEach(function (li) {
      var key = li.dataset.phase;
      li.classList.toggle("done", seen.indexOf(key) >= 0 && p.phase !== key);
      li.classList.toggle("current", !!p && p.phase === key);
    });
  }

  function renderChart(fig) {
    if (!chartEl || !fig || typeof Plotly === "undefined") return;
    chartEl.hidden = false;
    fig.layout = fig.layout || {};
    if (window.parallabThemed) fig.layout = window.parallabThemed(fig.layout);  // dark mode (figures.js)
    fig.layout.autosize = true;
    Plotly.react(chartEl, fig.data, fig.layout, { responsive: true, displaylogo: false });
  }

  function render(s) {
    statusEl.replaceChildren(badge(s.status));
    if (startedEl && s.started) startedEl.textContent = s.started;
    var p = s.progress || {};
    if (p.phase) {
      var name = (s.phase_names && s.phase_names[p.phase]) || p.phase;
      var text = name;
      if (p.steps) text += " · step " + (p.step != null ? p.step : "?") + " of " + p.steps;
      if (p.loss != null) text += " · loss " + Number(p.loss).toFixed(4);
      if (p.tokens_per_s != null) text += " · " + Math.round(p.tokens_per_s).toLocaleString() + " tokens/s";
      progressEl.textContent = text;
      if (bar && p.steps) { bar.max = p.steps; bar.value = p.step || 0; }
    } else if (s.status === "queued") {
      progressEl.textContent = s.scheduler ? "waiting for Slurm…" : "waiting for a worker…";
    } else if (!s.finished) {
      progressEl.textContent = s.scheduler ? "Slurm started it: starting the ranks…" : "a worker took it: starting the ranks…";
    }
    var scheduler = document.getElementById("run-scheduler");
    if (scheduler && s.scheduler) scheduler.textContent = s.scheduler;
    renderPhases(p);
    renderChart(s.chart);
    if (logEl && p.log != null) logEl.textContent = p.log;
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
  setTimeout(poll, 0);
})();
