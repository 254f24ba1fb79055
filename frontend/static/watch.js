// Pages that wait for runs (sweep, compare): poll the runs listed in #waiting[data-watch], update
// each one's state badge in place, and reload the page when one of them finishes, so its numbers
// fill in. A static file, not an inline script: the app's Content-Security-Policy allows only
// 'self' scripts.
(function () {
  "use strict";
  var box = document.getElementById("waiting");
  if (!box || !box.dataset.watch) return;
  var ids = box.dataset.watch.split(",");
  var finished = {};
  var delay = 2000;

  function badge(status) {
    var span = document.createElement("span");
    span.className = "badge status-" + status;
    span.textContent = status;
    return span;
  }

  function poll() {
    fetch("/watch.json?ids=" + encodeURIComponent(ids.join(",")), { headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (body) {
        var newlyFinished = false;
        body.runs.forEach(function (run) {
          var li = box.querySelector('li[data-run="' + run.id + '"] .run-state');
          if (li && li.textContent.trim() !== run.status) li.replaceChildren(badge(run.status));
          if (run.finished && finished[run.id] === false) newlyFinished = true;
          finished[run.id] = run.finished;
        });
        if (newlyFinished) { window.location.reload(); return; }
        delay = 2000;
        setTimeout(poll, delay);
      })
      .catch(function () { delay = Math.min(delay * 2, 15000); setTimeout(poll, delay); });
  }

  // what the page was rendered with: a run already finished then does not trigger a reload
  box.querySelectorAll("li[data-run]").forEach(function (li) {
    var state = li.querySelector(".badge").textContent.trim();
    finished[li.dataset.run] = ["succeeded", "failed", "cancelled"].indexOf(state) >= 0;
  });
  setTimeout(poll, delay);
})();
