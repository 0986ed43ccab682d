/* The run page's live timeline (plain JS, no build).
 *
 * Opens ws(s)://host/ws/runs/<runId>/?after=<last sequence on the page>&workspace=<tenant>/<ws>
 * while the timeline's newest page is shown and the run is not finished. Messages:
 *   {type: "event", sequence: N, html: "<tr ...>"}  appended in order; a duplicate
 *                                                   (sequence <= last) is ignored; a gap
 *                                                   (sequence > last + 1) is first filled from
 *                                                   .../timeline/rows/?after=last (the database)
 *   {type: "end", status}                            the run finished: no reconnect
 * A closed socket reconnects with backoff, from ?after=last. window.runledgerLive =
 * {socket, lastSequence, disconnect(ms)}; disconnect(ms) drops the socket and stays down for ms
 * (a laptop asleep), then reconnects and catches up.
 *
 * Also: copy buttons on payloads, and letting htmx swap the forms' 4xx answers (they carry the
 * validation message).
 */
(function () {
  "use strict";

  var live = null;

  function setState(state, text) {
    var el = document.getElementById("live-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
  }

  function setRunStatus(status) {
    var el = document.getElementById("run-status");
    if (!el || !status) return;
    el.className = "status status-" + status;
    el.dataset.status = status;
    el.textContent = status;
  }

  function Live(timeline) {
    this.timeline = timeline;
    this.tbody = timeline.querySelector("#timeline-rows");
    this.rowsUrl = timeline.dataset.rowsUrl;
    this.wsPath = timeline.dataset.wsPath;
    this.workspace = timeline.dataset.workspace;
    this.lastSequence = parseInt(timeline.dataset.lastSequence, 10) || 0;
    this.socket = null;
    this.queue = Promise.resolve();
    this.attempt = 0;
    this.timer = null;
    this.stopped = false;
    this.finished = false;
  }

  Live.prototype.url = function () {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    return scheme + window.location.host + this.wsPath + "?after=" + this.lastSequence +
      "&workspace=" + encodeURIComponent(this.workspace);
  };

  Live.prototype.connect = function () {
    var self = this;
    if (self.stopped || self.finished) return;
    clearTimeout(self.timer);
    self.timer = null;
    var socket = new WebSocket(self.url());
    self.socket = socket;
    socket.onopen = function () {
      if (self.socket !== socket) return;
      self.attempt = 0;
      setState("live", "live");
    };
    socket.onmessage = function (message) {
      if (self.socket !== socket) return;
      var data;
      try { data = JSON.parse(message.data); } catch (e) { return; }
      // One message at a time, in arrival order, even while a catch-up fetch is under way.
      self.queue = self.queue.then(function () { return self.handle(data); })
        .catch(function (err) { console.warn("runledger live:", err); });
    };
    socket.onclose = function () {
      if (self.socket !== socket) return;
      self.socket = null;
      if (self.stopped || self.finished || self.timer) return;
      self.retry(Math.min(10000, 500 * Math.pow(2, self.attempt++)));
    };
  };

  Live.prototype.retry = function (ms) {
    var self = this;
    setState("reconnecting", "reconnecting…");
    clearTimeout(self.timer);
    self.timer = setTimeout(function () {
      self.timer = null;
      // Whatever arrived before the drop is applied first, so ?after= is the true position.
      self.queue.then(function () { self.connect(); });
    }, ms);
  };

  Live.prototype.handle = function (data) {
    var self = this;
    if (data.type === "end") {
      self.finished = true;
      setState("finished", "finished");
      setRunStatus(data.status);
      self.timeline.dataset.finished = "1";
      if (self.socket) self.socket.close();
      return;
    }
    if (data.type !== "event" || typeof data.sequence !== "number") return;
    if (data.sequence <= self.lastSequence) return;  // a duplicate
    if (data.sequence > self.lastSequence + 1) {
      return self.catchUp().then(function () {
        if (data.sequence === self.lastSequence + 1) self.append(data.sequence, data.html);
      });
    }
    self.append(data.sequence, data.html);
  };

  Live.prototype.append = function (sequence, html) {
    if (sequence !== this.lastSequence + 1) return;
    var template = document.createElement("template");
    template.innerHTML = html.trim();
    var row = template.content.firstElementChild;
    if (!row) return;
    this.tbody.appendChild(row);
    this.lastSequence = sequence;
    this.timeline.dataset.lastSequence = String(sequence);
  };

  /* Fill a gap from the database: the rows fragment, page after page, until nothing is missing. */
  Live.prototype.catchUp = function () {
    var self = this;
    var url = self.rowsUrl + "?limit=1000&after=" + self.lastSequence;
    return fetch(url, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (response) {
        if (!response.ok) throw new Error("catch-up failed: " + response.status);
        return response.text();
      })
      .then(function (text) {
        var template = document.createElement("template");
        template.innerHTML = text;
        var rows = template.content.querySelectorAll("tr.event");
        var added = 0;
        rows.forEach(function (row) {
          var sequence = parseInt(row.dataset.sequence, 10);
          if (sequence === self.lastSequence + 1) {
            self.tbody.appendChild(row);
            self.lastSequence = sequence;
            added++;
          }
        });
        self.timeline.dataset.lastSequence = String(self.lastSequence);
        if (rows.length === 1000 && added > 0) return self.catchUp();
      });
  };

  Live.prototype.disconnect = function (ms) {
    var socket = this.socket;
    this.socket = null;  // its close event is ours, not a drop to retry at once
    if (socket) socket.close();
    if (!this.finished && !this.stopped) this.retry(ms || 0);
  };

  Live.prototype.stop = function () {
    this.stopped = true;
    clearTimeout(this.timer);
    var socket = this.socket;
    this.socket = null;
    if (socket) socket.close();
  };

  function publish() {
    window.runledgerLive = {
      get socket() { return live ? live.socket : null; },
      get lastSequence() {
        if (live) return live.lastSequence;
        var timeline = document.getElementById("timeline");
        return timeline ? parseInt(timeline.dataset.lastSequence, 10) || 0 : 0;
      },
      disconnect: function (ms) { if (live) live.disconnect(ms); },
    };
  }

  /* (Re)attach to whatever timeline is on the page: after a load, and after every htmx swap. */
  function attach() {
    var timeline = document.getElementById("timeline");
    if (live && live.timeline === timeline) return;
    if (live) { live.stop(); live = null; }
    if (timeline && timeline.dataset.live === "1") {
      if (timeline.dataset.finished === "1") {
        setState("finished", "finished");
      } else {
        live = new Live(timeline);
        live.connect();
      }
    }
    publish();
  }

  function copy(button) {
    var pre = button.parentElement.querySelector("pre");
    if (!pre) return;
    var text = pre.textContent;
    var done = function () {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallbackCopy(pre, done); });
    } else {
      fallbackCopy(pre, done);
    }
  }

  function fallbackCopy(pre, done) {
    var range = document.createRange();
    range.selectNodeContents(pre);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    try { if (document.execCommand("copy")) done(); } catch (e) { /* selected; the user can copy */ }
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.copy");
    if (button) copy(button);
  });

  // The forms answer a refusal with 400/403/409 and the re-rendered form; show it (htmx 2 does
  // not swap error responses by default).
  document.addEventListener("htmx:beforeSwap", function (event) {
    var status = event.detail.xhr.status;
    var source = event.detail.elt;
    var isForm = source && source.closest && (source.closest("#feedback-form") || source.closest(".reconcile-form")
                                                  || source.closest(".cancel-form"));
    if (isForm && (status === 400 || status === 409)) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });

  document.addEventListener("htmx:afterSettle", attach);
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", attach);
  } else {
    attach();
  }
})();
