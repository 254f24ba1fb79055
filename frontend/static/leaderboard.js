// Leaderboard: filters apply as soon as one changes.
(function () {
  "use strict";
  var form = document.getElementById("leaderboard-filters");
  if (!form) return;
  form.querySelectorAll("select").forEach(function (s) {
    s.addEventListener("change", function () { form.submit(); });
  });
})();
