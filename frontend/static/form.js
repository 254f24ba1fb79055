// The job form: show only the chosen strategy's options, keep the preset's shape as placeholders,
// and check the job and show its prediction as the user types (the server checks again on submit).
(function () {
  "use strict";
  var form = document.getElementById("run-form");
  if (!form) return;
  var presets = JSON.parse(document.getElementById("presets").textContent);
  var body = document.getElementById("prediction-body");
  var state = document.getElementById("check-state");
  var submit = document.getElementById("submit-run");
  var timer = null;
  var seq = 0;

  function showStrategy() {
    var chosen = form.elements.strategy.value;
    document.querySelectorAll(".strategy-options").forEach(function (div) {
      div.hidden = div.dataset.strategy !== chosen;
    });
  }

  function showPreset() {
    var preset = presets[form.elements.model.value];
    if (!preset) return;
    Object.keys(preset).forEach(function (name) {
      var input = form.elements[name];
      if (input && input.tagName === "INPUT") input.placeholder = preset[name] == null ? "" : preset[name];
      // a shape choice's blank option (the preset's own) names the preset's value
      else if (input && input.tagName === "SELECT" && input.options.length && input.options[0].value === "")
        input.options[0].textContent = "preset: " + String(preset[name]).toLowerCase();
    });
  }

  function bytes(n) {
    if (n == null) return "—";
    var units = [["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
    for (var i = 0; i < units.length; i++) if (Math.abs(n) >= units[i][1]) return (n / units[i][1]).toFixed(2) + " " + units[i][0];
    return n + " B";
  }

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text != null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  var marked = 0;

  function showErrors(errors) {
    marked = 0;
    document.querySelectorAll("[data-errors-for]").forEach(function (box) {
      var name = box.dataset.errorsFor;
      var msgs = errors[name] || [];
      box.replaceChildren.apply(box, msgs.map(function (m) { var p = el("p", m, "field-error"); p.setAttribute("role", "alert"); return p; }));
      var field = box.closest(".field");
      if (field) field.classList.toggle("invalid", msgs.length > 0);
      if (msgs.length) marked += 1;
      var section = box.closest("details");
      if (section && msgs.length) section.open = true;  // never hide a reason inside a closed section
    });
    var general = [];
    Object.keys(errors).forEach(function (name) {
      if (!document.querySelector('[data-errors-for="' + CSS.escape(name) + '"]')) general = general.concat(errors[name]);
    });
    return general;
  }

  function row(table, label, value) {
    var tr = el("tr");
    tr.appendChild(el("th", label));
    tr.appendChild(el("td", value, "num"));
    table.appendChild(tr);
  }

  // a pasted config's shape shown in the shape fields (as their placeholders: a value typed in a
  // field still overrides the config), the preset's again once the box is emptied
  function showShape(shape) {
    showPreset();
    Object.keys(shape || {}).forEach(function (name) {
      var input = form.elements[name];
      var value = shape[name] == null ? "" : String(shape[name]);
      if (input && input.tagName === "INPUT") input.placeholder = value;
      else if (input && input.tagName === "SELECT" && input.options.length && input.options[0].value === "")
        input.options[0].textContent = "config: " + value.toLowerCase();
      var field = input && input.closest(".field");
      if (field) field.classList.add("from-config");
    });
    if (!shape) document.querySelectorAll(".field.from-config").forEach(function (f) { f.classList.remove("from-config"); });
    else { var box = form.elements.hf_config.closest("details"); if (box) box.open = true; }
  }

  function render(result) {
    var general = showErrors(result.errors || {});
    if (result.name && form.elements.name) form.elements.name.placeholder = result.name;
    if (result.ok || result.shape) showShape(result.shape);
    body.replaceChildren();
    if (!result.ok) {
      body.appendChild(el("p", marked ? "This job cannot run as it stands — see the marked fields." : "This job cannot run as it stands:", "bad"));
      general.forEach(function (m) { body.appendChild(el("p", m, "field-error")); });
    }
    var p = result.prediction;
    if (p) {
      var ms = p.model_state_bytes_per_rank || {};
      var t = el("table", null, "data compact");
      body.appendChild(el("h3", "Memory per rank"));
      row(t, "parameters", bytes(ms.params));
      row(t, "gradients", bytes(ms.grads));
      row(t, "optimizer state", bytes(ms.optimizer));
      if (p.activation_bytes_per_rank != null) row(t, "activations", bytes(p.activation_bytes_per_rank));
      body.appendChild(t);
      if (result.fit) {
        var share = result.fit.total_bytes / result.fit.host_memory_bytes;
        var meter = el("div", null, "meter" + (result.fit.fits ? "" : " over"));
        var fill = el("span");
        fill.style.width = Math.min(100, share * 100).toFixed(1) + "%";
        meter.appendChild(fill);
        body.appendChild(meter);
        body.appendChild(el("p", "all ranks: " + bytes(result.fit.total_bytes) + " of this host's " + bytes(result.fit.host_memory_bytes), "small muted"));
      }
      var comm = p.comm_bytes_per_step || {};
      var ops = Object.keys(comm);
      body.appendChild(el("h3", "Communication per step"));
      if (ops.length) {
        var ct = el("table", null, "data compact");
        ops.forEach(function (op) { row(ct, op, bytes(comm[op])); });
        body.appendChild(ct);
      } else {
        body.appendChild(el("p", "none predicted", "muted small"));
      }
      if (p.bubble_fraction != null) {
        body.appendChild(el("h3", "Pipeline bubble"));
        body.appendChild(el("p", (p.bubble_fraction * 100).toFixed(1) + "% of each step idle (theory)"));
      }
    }
    if (submit && !submit.dataset.locked) submit.disabled = !result.ok;
    state.textContent = result.ok ? "Ready to submit." : marked ? "Fix the marked fields to submit." : "Cannot submit: " + general.join("; ");
  }

  function check() {
    var data = new FormData(form);
    data.delete("csrf_token");
    var params = new URLSearchParams();
    data.forEach(function (v, k) { params.append(k, v); });
    var mine = ++seq;
    state.textContent = "Checking…";
    fetch("/runs/new/plan.json?" + params.toString(), { headers: { Accept: "application/json" } })
      .then(function (r) { return r.json(); })
      .then(function (result) { if (mine === seq) render(result); })
      .catch(function () { if (mine === seq) state.textContent = "Could not check the job (the server will check it on submit)."; });
  }

  function later() { clearTimeout(timer); timer = setTimeout(check, 250); }

  if (submit && submit.disabled) submit.dataset.locked = "1";
  form.elements.strategy.addEventListener("change", showStrategy);
  form.elements.model.addEventListener("change", showPreset);
  form.addEventListener("input", later);
  form.addEventListener("change", later);
  showStrategy();
  showPreset();
  check();
})();
