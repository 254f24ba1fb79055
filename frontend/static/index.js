// Tick runs to compare: the button counts them and opens /compare?ids=...
(function () {
  "use strict";
  var ticks = document.querySelectorAll(".compare-tick");
  var button = document.getElementById("compare-button");
  var count = document.getElementById("compare-count");
  if (!button) return;
  function update() {
    var n = Array.prototype.filter.call(ticks, function (t) { return t.checked; }).length;
    button.disabled = n < 2;
    count.textContent = n === 0 ? "Tick runs to compare" : n + " selected" + (n < 2 ? " — tick one more" : "");
    document.getElementById("compare-bar").classList.toggle("active", n > 0);
  }
  ticks.forEach(function (t) { t.addEventListener("change", update); });
  update();
})();

// Live rows: queued and running runs poll their status; when one finishes, the page reloads to show
// its figures (unless runs are ticked for comparison, which a reload would lose: then only the
// badge changes).
(function () {
  "use strict";
  var rows = Array.prototype.slice.call(document.querySelectorAll("tr[data-live-run]"));
  if (!rows.length) return;
  function ticked() {
    return Array.prototype.some.call(document.querySelectorAll(".compare-tick"), function (t) { return t.checked; });
  }
  function poll() {
    var pending = rows.map(function (row) {
      return fetch("/runs/" + encodeURIComponent(row.dataset.liveRun) + "/status.json", { headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (s) {
          if (!s) return false;
          var badge = row.querySelector(".live-status .badge");
          badge.textContent = s.status;
          badge.className = "badge status-" + s.status;
          var p = s.progress;
          var line = row.querySelector(".live-progress");
          if (line && p && !s.finished) line.textContent = (p.phase === "reference" ? "reference " : "step ") + p.step + "/" + p.steps;
          if (s.finished && line) line.textContent = "";
          return s.finished;
        })
        .catch(function () { return false; });
    });
    Promise.all(pending).then(function (done) {
      if (done.some(Boolean) && !ticked()) { window.location.reload(); return; }
      rows = rows.filter(function (_, i) { return !done[i]; });
      if (rows.length) window.setTimeout(poll, 2000);
    });
  }
  window.setTimeout(poll, 2000);
})();
