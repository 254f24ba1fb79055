// Draw every figure on the page from its JSON (built in Python with plotly.graph_objects).
(function () {
  "use strict";
  function draw() {
    document.querySelectorAll("figure.chart[data-figure]").forEach(function (el) {
      var src = document.getElementById(el.dataset.figure);
      if (!src) return;
      var fig = JSON.parse(src.textContent);
      fig.layout = fig.layout || {};
      fig.layout.autosize = true;
      delete fig.layout.width;
      Plotly.newPlot(el, fig.data, fig.layout, { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw); else draw();
})();
