// Draw every figure on the page from its JSON (built in Python with plotly.graph_objects).
(function () {
  "use strict";
  // Dark mode follows the system setting (prefers-color-scheme, as app.css does): the figures keep
  // their trace colours but take the page's background, a light font and dim grid lines.
  var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  function themed(layout) {
    if (!dark) return layout;
    layout.paper_bgcolor = "rgba(0,0,0,0)";
    layout.plot_bgcolor = "rgba(0,0,0,0)";
    layout.font = Object.assign({}, layout.font, { color: "#e5e7eb" });
    Object.keys(layout).forEach(function (key) {
      if (/^[xy]axis\d*$/.test(key)) layout[key] = Object.assign({}, layout[key], { gridcolor: "#334155", zerolinecolor: "#475569", linecolor: "#475569" });
    });
    if (layout.legend) layout.legend = Object.assign({}, layout.legend, { bgcolor: "rgba(0,0,0,0)" });
    return layout;
  }
  window.parallabThemed = themed;
  function plot(el, fig) {
    fig.layout = themed(fig.layout || {});
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
