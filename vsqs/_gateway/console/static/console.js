// vsqs console: live numbers and the name filter. No framework, no inline script;
// it only ever sets textContent and numeric SVG attributes, never HTML.
(function () {
  "use strict";
  var PERIOD = 5000;
  var body = document.body;
  var url = body.getAttribute("data-refresh");
  var status = document.querySelector("[data-live-status]");

  function say(text) { if (status) { status.textContent = text; } }

  function rowsOf(name) {
    return Array.prototype.filter.call(document.querySelectorAll("[data-queue]"), function (el) {
      return el.getAttribute("data-queue") === name;
    });
  }

  function apply(data) {
    (data.queues || []).forEach(function (q) {
      rowsOf(q.name).forEach(function (row) {
        Object.keys(q.text || {}).forEach(function (key) {
          row.querySelectorAll('[data-count="' + key + '"]').forEach(function (cell) {
            cell.textContent = q.text[key];
            if (q.raw && q.raw[key] !== undefined && q.raw[key] !== null) { cell.setAttribute("data-value", String(q.raw[key])); }
          });
        });
        var line = row.querySelector("[data-spark] polyline");
        if (line && typeof q.spark === "string" && /^[0-9., ]*$/.test(q.spark)) { line.setAttribute("points", q.spark); }
        row.classList.toggle("suspended", !!q.suspended);
      });
    });
    var total = document.getElementById("queue-total");
    if (total && body.getAttribute("data-page") === "overview" && data.queues &&
        String(data.queues.length) !== total.getAttribute("data-total")) {
      say("queues were added or removed: reload the page to see them");
    } else {
      say("updated " + new Date().toLocaleTimeString());
    }
  }

  function refresh() {
    if (!url || document.hidden) { return; }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.json(); })
      .then(apply)
      .catch(function (e) { say("not updated (" + e.message + ")"); });
  }

  if (url) {
    refresh();
    window.setInterval(refresh, PERIOD);
    document.addEventListener("visibilitychange", refresh);
  }

  // the name filter narrows the table as you type (the form still works without script)
  var filter = document.getElementById("filter");
  if (filter) {
    filter.addEventListener("input", function () {
      var needle = filter.value.toLowerCase();
      document.querySelectorAll("#queues tbody tr[data-queue]").forEach(function (row) {
        row.hidden = needle !== "" && row.getAttribute("data-queue").toLowerCase().indexOf(needle) < 0;
      });
    });
    document.addEventListener("keydown", function (e) {
      var t = e.target && e.target.tagName;
      if (e.key === "/" && t !== "INPUT" && t !== "TEXTAREA") { e.preventDefault(); filter.focus(); }
    });
  }

  // the purge button stays disabled until the queue's name is typed
  var confirmBox = document.getElementById("purge-confirm");
  if (confirmBox) {
    var button = confirmBox.form.querySelector("button");
    var wanted = body.getAttribute("data-queue-page");
    var check = function () { button.disabled = confirmBox.value !== wanted; };
    confirmBox.addEventListener("input", check);
    check();
  }
}());
