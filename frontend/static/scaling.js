// Scaling: picking a workload also picks its hardware, then shows it.
(function () {
  "use strict";
  var select = document.getElementById("workload-select");
  var hw = document.getElementById("hardware-input");
  if (!select || !hw) return;
  select.addEventListener("change", function () {
    hw.value = select.options[select.selectedIndex].dataset.hardware || "";
    select.form.submit();
  });
})();
