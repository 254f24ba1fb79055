// Draw every figure on the page from its JSON (built in Python with plotly.graph_objects).
(function () {
  "use strict";
  function plot(el, fig) {
    fig.layout = fig.layout || {};
    fig.layout.autosize = true;
    delete fig.layout.width;
    el.replaceChildren();
    Plotly.newPlot(el, fig.data, fig.layout, { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] });
  }
  function draw() {
    document.querySelectorAll("figure.chart[data-figure]").forEach(function (el) {
      if (el.dataset.src) {  // a heavy figure (a run's timeline), fetched after the page, downsampled
        fetch(el.dataset.src, { headers: { Accept: "application/json" } })
          .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
          .then(function (fig) { plot(el, fig); })
          .catch(function (err) { el.textContent = "Could not load this figure (" + err.message + ")."; });
        return;
      }
      var src = document.getElementById(el.dataset.figure);
      if (!src) return;
      plot(el, JSON.parse(src.textContent));
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw); else draw();
})();
