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
