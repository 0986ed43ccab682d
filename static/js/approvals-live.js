// Approvals page, live: console/live/reexecutions.py says when a request of the workspace changed
// (asked, approved, denied, expired, started, finished); the list is reloaded from the page's own
// fragment, so a push shows what a reload shows. The navigation's count follows. Without
// JavaScript the page is the same, as of its last load.
(function () {
  "use strict";
  var body = document.getElementById("approvals-body");
  var status = document.getElementById("live-status");
  var badge = document.getElementById("pending-badge");
  if (!body || !("WebSocket" in window)) return;
  var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + body.dataset.socket;
  var delay = 500;

  function show(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  function typing() {
    // Never replace a note someone is writing: reload once they leave the field.
    var active = document.activeElement;
    return active && body.contains(active) && active.name === "note" && active.value;
  }

  var pendingReload = false;
  function reload() {
    if (typing()) { pendingReload = true; return; }
    pendingReload = false;
    fetch(body.dataset.listUrl, { headers: { "HX-Request": "true" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) { body.innerHTML = html; if (window.htmx) htmx.process(body); } });
  }
  body.addEventListener("focusout", function () { if (pendingReload) setTimeout(reload, 0); });

  function connect() {
    var socket = new WebSocket(url);
    socket.onopen = function () { delay = 500; show("live", "live"); reload(); };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.type !== "reexecution") return;
      if (badge) { badge.textContent = message.pending; badge.hidden = !message.pending; }
      reload();
    };
    socket.onclose = function () {
      show("reconnecting", "reconnecting…");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 15000);
    };
  }
  connect();
})();
