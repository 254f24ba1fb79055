// Compare page: "differences only" hides rows where every run has the same value; the baseline
// selector reloads with the new baseline (values relative to it are computed on the server).
(function () {
  "use strict";
  var toggle = document.getElementById("diff-only");
  var table = document.getElementById("compare-table");
  var select = document.getElementById("baseline-select");
  if (toggle && table) {
    var key = "parallab.compare.diffOnly";
    toggle.checked = window.localStorage && localStorage.getItem(key) === "1";
    var apply = function () {
      table.classList.toggle("diff-only", toggle.checked);
      try { localStorage.setItem(key, toggle.checked ? "1" : "0"); } catch (e) { /* private mode */ }
    };
    toggle.addEventListener("change", apply);
    apply();
  }
  if (select) select.addEventListener("change", function () { select.form.submit(); });
})();
