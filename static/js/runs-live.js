// Runs list, live: rows pushed by console/live/runs.py (rendered from the page's row template).
// A row already on the page is replaced in place; a new run is inserted at the top. The page only
// loads this script on the unfiltered first page, where every new run belongs.
(function () {
  "use strict";
  var table = document.querySelector("table.runs[data-socket]");
  var rows = document.getElementById("runs-rows");
  var status = document.getElementById("live-status");
  if (!table || !rows || !("WebSocket" in window)) return;
  var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + table.dataset.socket;
  var delay = 500;
  var MAX_DELAY = 15000;

  function show(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  function rowFrom(html) {
    var tbody = document.createElement("tbody");
    tbody.innerHTML = html.trim();
    return tbody.querySelector("tr.run");
  }

  function place(message) {
    var row = rowFrom(message.html);
    if (!row) return;
    var existing = null;
    rows.querySelectorAll("tr.run").forEach(function (tr) {
      if (tr.dataset.runId === message.runId) existing = tr;
    });
    if (existing) {
      existing.replaceWith(row);
    } else {
      var empty = rows.querySelector("tr.empty");
      if (empty) empty.remove();
      rows.insertBefore(row, rows.firstChild);
      row.classList.add("arrived");
    }
    if (window.htmx) window.htmx.process(row);
  }

  // After a dropped connection, runs that started meanwhile were never pushed: read the first
  // page again (the htmx rows fragment) and merge it, oldest first so the newest ends on top.
  function catchUp() {
    fetch(location.pathname, {headers: {"HX-Request": "true"}, credentials: "same-origin"})
      .then(function (response) { return response.ok ? response.text() : ""; })
      .then(function (html) {
        var tbody = document.createElement("tbody");
        tbody.innerHTML = html;
        var fresh = Array.prototype.slice.call(tbody.querySelectorAll("tr.run")).reverse();
        fresh.forEach(function (tr) { place({runId: tr.dataset.runId, html: tr.outerHTML}); });
      })
      .catch(function () {});
  }

  var dropped = false;

  function connect() {
    var socket = new WebSocket(url);
    socket.onopen = function () {
      delay = 500;
      show("live", "live");
      if (dropped) catchUp();
    };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.type === "run") place(message);
    };
    socket.onclose = function () {
      dropped = true;
      show("reconnecting", "reconnecting…");
      // Back off (with jitter) so a restarting server is not stampeded by every open tab.
      setTimeout(connect, delay + Math.random() * delay / 2);
      delay = Math.min(delay * 2, MAX_DELAY);
    };
  }

  connect();
})();
