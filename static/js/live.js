/* Runledger's one live mechanism (plain JS, no build), for every live page.
 *
 * The page says where its socket is and what on it shows state; the server renders everything:
 *
 *   [data-live-socket="/ws/..."]  the page's one socket (none on a page that cannot change: a
 *                                 finished run's page is static). With data-live-after="N" the
 *                                 socket is a run's feed and is asked for ?after=<last sequence
 *                                 received>, plus data-live-workspace="tenant/ws" as ?workspace=.
 *   [data-live-src="URL"]         a fragment the server renders: fetched again (as an htmx
 *                                 request) when the socket says something changed, and swapped
 *                                 in place (data-live-swap: outerHTML, the default, or innerHTML;
 *                                 an empty URL means the page's own address, e.g. the open tab).
 *                                 Skipped while it holds [data-live-skip] (the timeline, which
 *                                 follows by appending) or while someone types in one of its fields.
 *   #timeline[data-live="1"]      the newest page of a run's timeline: each {type: "event",
 *                                 sequence, html} row is appended in order, a gap is filled from
 *                                 data-rows-url, a duplicate ignored; past data-live-keep events
 *                                 the oldest rows go and "← older" leads to them.
 *   #live-status                  connecting… / live / reconnecting… / finished.
 *   [data-announce="Label"][id]   inside a fragment: when a refresh changes its text, "Label: text"
 *                                 goes to #live-announce (a polite live region), so a screen reader
 *                                 hears the change without the fragment being read out again.
 *
 * Socket messages: "event" (a run's row), "end" (the run finished: one last refresh, the socket
 * closes, no reconnect); any other message means "something of this page changed". Refreshes are
 * coalesced (messages within 250 ms on a run's feed, 1 s on a workspace's, make one): while one is
 * in flight, further messages ask for one more after it, never more.
 * A dropped socket reconnects with backoff and refreshes everything once it is back (a
 * workspace's feed, which has no ?after= catch-up, also refreshes once when it first opens).
 *
 * A fragment fetched again and found the same as shown (its forms' CSRF tokens aside) is not
 * swapped: a click, a selection or an open detail in it survives a refresh that changed nothing.
 * One that is swapped keeps the keyboard focus on the same link or button in its new markup, the
 * boxes ticked and what was typed in its fields and not yet sent.
 *
 * window.runledgerLive = {socket, lastSequence, refreshes, unchanged, disconnect(ms)} for tests
 * and the curious.
 */
(function () {
  "use strict";

  // How long a burst of messages may gather into one refresh: a run's page follows its run closely;
  // a workspace's list (runs, approvals, a batch) hears of every model call of every run in it, and
  // each of its refreshes renders the whole list, so it refreshes at most about once a second.
  var COALESCE_MS = 250;
  var COALESCE_LIST_MS = 1000;
  var root = null;        // the [data-live-socket] element
  var socket = null;
  var attempt = 0;
  var retryTimer = null;
  var finished = false;
  var received = 0;       // a run feed's last sequence received
  var queue = Promise.resolve();  // timeline appends, in arrival order
  var refreshTimer = null;
  var refreshing = false;
  var wanted = false;
  var held = [];          // fragments not refreshed because someone was typing in them
  var refreshes = 0;
  var unchanged = 0;      // fragments fetched again and found as shown: left alone
  var shown = {};         // id → a fragment's markup as loaded or as last swapped in

  function setState(state, text) {
    var el = document.getElementById("live-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
  }

  function socketUrl() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var url = scheme + window.location.host + root.dataset.liveSocket;
    if (root.dataset.liveAfter !== undefined) {
      url += "?after=" + received;
      if (root.dataset.liveWorkspace) url += "&workspace=" + encodeURIComponent(root.dataset.liveWorkspace);
    }
    return url;
  }

  function connect() {
    if (finished || !root) return;
    clearTimeout(retryTimer);
    retryTimer = null;
    var mine = new WebSocket(socketUrl());
    socket = mine;
    mine.onopen = function () {
      if (socket !== mine) return;
      var again = attempt > 0;
      attempt = 0;
      setState("live", "live");
      // Whatever happened while the socket was down, or (a workspace's feed, which sends no
      // catch-up) between the page's rendering and this moment.
      if (again || root.dataset.liveAfter === undefined) changed(true);
    };
    mine.onmessage = function (message) {
      if (socket !== mine) return;
      var data;
      try { data = JSON.parse(message.data); } catch (e) { return; }
      handle(data);
    };
    mine.onclose = function () {
      if (socket !== mine) return;
      socket = null;
      if (finished || retryTimer) return;
      retry(Math.min(10000, 500 * Math.pow(2, attempt++)));
    };
  }

  function retry(ms) {
    setState("reconnecting", "reconnecting…");
    clearTimeout(retryTimer);
    retryTimer = setTimeout(function () {
      retryTimer = null;
      attempt = Math.max(attempt, 1);
      // Rows that arrived before the drop are applied first, so ?after= is the true position.
      queue.then(connect);
    }, ms + Math.random() * ms / 4);
  }

  function handle(data) {
    if (data.type === "event" && typeof data.sequence === "number") {
      if (data.sequence > received) received = data.sequence;
      queue = queue.then(function () { return append(data.sequence, data.html); })
        .catch(function (err) { console.warn("runledger live:", err); });
      changed();
      return;
    }
    if (data.type === "end") {
      finished = true;
      setState("finished", "finished");
      var timeline = document.getElementById("timeline");
      if (timeline) timeline.dataset.finished = "1";
      if (socket) { var s = socket; socket = null; s.close(); }
      queue.then(function () { changed(true); });
      return;
    }
    changed();
  }

  // --- fragments ---------------------------------------------------------------------------

  function changed(now) {
    wanted = true;
    if (refreshing) return;  // one more refresh follows the one in flight
    clearTimeout(refreshTimer);
    var gather = root.dataset.liveAfter === undefined ? COALESCE_LIST_MS : COALESCE_MS;
    refreshTimer = setTimeout(refreshAll, now ? 0 : gather);
  }

  function editing(el) {
    var active = document.activeElement;
    return !!active && active !== document.body && el.contains(active) &&
      /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName) && active.type !== "checkbox" && !!active.value;
  }

  // A request of the user's inside the fragment is on its way (htmx marks its element
  // .htmx-request): swapping the fragment now would take away the element its answer goes to.
  // Asked again after it (done() -> changed()).
  function busy(el) {
    return leaving || el.classList.contains("htmx-request") || !!el.querySelector(".htmx-request");
  }

  // A form sent the plain way (no htmx: Approve, Cancel run…) navigates away with its answer;
  // Chromium drops the submission if its form leaves the document first, so nothing is swapped
  // meanwhile. htmx's own forms prevent the default, and are its requests (above). A page still
  // here after a while got a download or an error instead: it follows the log again.
  var leaving = false;
  document.addEventListener("submit", function (event) {
    if (event.defaultPrevented) return;
    leaving = true;
    setTimeout(function () { leaving = false; }, 5000);
  });

  function refreshAll() {
    refreshTimer = null;
    if (!wanted) return;
    wanted = false;
    refreshing = true;
    held = [];
    var targets = Array.prototype.slice.call(document.querySelectorAll("[data-live-src]"));
    var work = targets.map(function (el) {
      if (el.querySelector("[data-live-skip]") || el.hasAttribute("data-live-skip")) return null;
      if (busy(el)) { wanted = true; return null; }
      if (editing(el)) { held.push(el); return null; }
      return refresh(el);
    });
    Promise.all(work).then(done, done);
  }

  function done() {
    refreshing = false;
    refreshes++;
    if (wanted) changed();
  }

  function refresh(el) {
    var src = el.getAttribute("data-live-src");
    var here = window.location.pathname + window.location.search;
    var url = src || here;
    var headers = {"HX-Request": "true", "HX-Current-URL": window.location.href, "Accept": "text/html"};
    return fetch(url, {credentials: "same-origin", headers: headers})
      .then(function (response) {
        // Signed out meanwhile: the server names the login page, as it does to htmx.
        var login = response.headers.get("HX-Redirect");
        if (login) { window.location.assign(login); return null; }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html === null || !el.isConnected) return;
        // The open tab changed while this was asked (a click): its own request answers.
        if (!src && window.location.pathname + window.location.search !== here) return;
        // An older page was brought in while this was asked (the runs list's "Next page"): the
        // first page must not be swapped back over it.
        if (el.querySelector("[data-live-skip]") || el.hasAttribute("data-live-skip")) return;
        if (busy(el)) { wanted = true; return; }
        if (editing(el)) { held.push(el); return; }
        // Nothing changed: the DOM stays as it is, so a click, a selection or an open panel in
        // it is not lost to a swap that would put back the same thing.
        var fresh = markup(html);
        if (el.id && shown[el.id] === fresh) { unchanged++; return; }
        var open = [];
        el.querySelectorAll("details[open][id]").forEach(function (d) { open.push(d.id); });
        // Ticked boxes (the runs picked for a batch or a dataset) stay ticked across the swap.
        var ticked = [];
        el.querySelectorAll("input[type=checkbox][name]:checked").forEach(function (box) {
          ticked.push([box.name, box.value]);
        });
        var style = el.getAttribute("data-live-swap") || "outerHTML";
        var kept = typedIn(el);
        var focused = focusedIn(el);
        var said = announced(el);
        window.htmx.swap(el, html, {swapStyle: style, swapDelay: 0, settleDelay: 0});
        if (el.id) shown[el.id] = fresh;
        var now = style === "innerHTML" ? el : (el.id && document.getElementById(el.id));
        if (now) {
          retype(now, kept);
          if (focused) refocus(now, focused);
          announce(now, said);
        }
        open.forEach(function (id) {
          var d = document.getElementById(id);
          if (d) d.open = true;
        });
        ticked.forEach(function (pair) {
          document.querySelectorAll("input[type=checkbox][name]").forEach(function (box) {
            if (box.name === pair[0] && box.value === pair[1]) box.checked = true;
          });
        });
        if (window.runledgerPlace) window.runledgerPlace(document);
      });
  }

  /* What someone typed in a fragment and has not sent (a note, then Tab to Approve) survives its
     swap: the same field of the same form in the new markup gets it back. A field is the same when
     its form sends to the same address with the same hidden values (which run, which call) under
     the same name; a field outside a form, when it has the same name under the same id. */
  function fieldKey(field) {
    var form = field.form;
    if (!form) {
      var holder = field.parentElement && field.parentElement.closest("[id]");
      return "#" + (holder ? holder.id : "") + " " + field.name;
    }
    var hidden = Array.prototype.filter.call(form.querySelectorAll("input[type=hidden][name]"), function (h) {
      return h.name !== "csrfmiddlewaretoken";
    }).map(function (h) { return h.name + "=" + h.value; });
    return (form.getAttribute("action") || "") + " " + hidden.join("&") + " " + field.name;
  }

  function typedFields(el) {
    return Array.prototype.filter.call(el.querySelectorAll("input[name], textarea[name]"), function (field) {
      return !/^(hidden|checkbox|radio|submit|button|file|password)$/.test(field.type) &&
        field.value !== field.defaultValue;
    });
  }

  function typedIn(el) {
    return typedFields(el).map(function (field) { return [fieldKey(field), field.value]; });
  }

  function retype(root, kept) {
    if (!kept.length) return;
    var fields = root.querySelectorAll("input[name], textarea[name]");
    kept.forEach(function (pair) {
      for (var i = 0; i < fields.length; i++) {
        if (fieldKey(fields[i]) === pair[0]) { fields[i].value = pair[1]; return; }
      }
    });
  }

  // Focus inside a fragment survives its swap: a keyboard user on a run's link, an Approve button
  // or a tab stays there, rather than being thrown back to the top of the page. htmx keeps an
  // element with an id by itself; the others are found again by what they point at.
  var SAME = ["href", "name", "value", "formaction", "aria-controls", "aria-label", "data-tab"];

  function focusedIn(el) {
    var active = document.activeElement;
    if (!active || active === document.body || active === el || !el.contains(active)) return null;
    var like = Array.prototype.filter.call(el.querySelectorAll(active.tagName), function (other) {
      return sameAs(other, active);
    });
    return {element: active, index: like.indexOf(active)};
  }

  function sameAs(a, b) {
    return SAME.every(function (name) { return a.getAttribute(name) === b.getAttribute(name); });
  }

  function refocus(root, focused) {
    var active = document.activeElement;
    if (focused.element.isConnected || (active && active !== document.body)) return;
    var like = Array.prototype.filter.call(root.querySelectorAll(focused.element.tagName), function (other) {
      return sameAs(other, focused.element);
    });
    var again = like[Math.min(Math.max(focused.index, 0), like.length - 1)];
    if (again) again.focus({preventScroll: true});
  }

  /* [data-announce="Run status"]: when a swap changes its text, "Run status: completed" is said in
     the page's #live-announce (a polite live region present from the start), and nothing else
     of the swapped fragment is read out again. */
  function announced(el) {
    var said = {};
    el.querySelectorAll("[data-announce][id]").forEach(function (node) { said[node.id] = node.textContent.trim(); });
    return said;
  }

  function announce(root, said) {
    var region = document.getElementById("live-announce");
    if (!region) return;
    var lines = [];
    root.querySelectorAll("[data-announce][id]").forEach(function (node) {
      var text = node.textContent.trim();
      if (said[node.id] !== undefined && said[node.id] !== text) lines.push(node.dataset.announce + ": " + text);
    });
    if (lines.length) region.textContent = lines.join(". ");
  }

  // A fragment as the parser writes it back, without the whitespace around it: what the server
  // sent, comparable with what the page was loaded with (recorded before any script touches it)
  // and with the last swap.
  // A form's CSRF token is masked afresh on every rendering: it is left out of the comparison, or a
  // fragment with a form would be swapped on every refresh. The token shown stays valid.
  function markup(html) {
    var template = document.createElement("template");
    template.innerHTML = html;
    template.content.querySelectorAll("input[name=csrfmiddlewaretoken]").forEach(function (token) {
      token.removeAttribute("value");
    });
    return template.innerHTML.trim();
  }

  function record() {
    document.querySelectorAll("[data-live-src][id]").forEach(function (el) {
      var inner = el.getAttribute("data-live-swap") === "innerHTML";
      shown[el.id] = markup(inner ? el.innerHTML : el.outerHTML);
    });
  }

  // Anything else that swaps (a tab, a form, the history) makes the records unsafe to trust.
  ["htmx:beforeSwap", "htmx:historyRestore"].forEach(function (name) {
    document.addEventListener(name, function () { shown = {}; });
  });

  document.addEventListener("focusout", function () {
    if (!held.length) return;
    setTimeout(function () {
      if (held.some(function (el) { return el.isConnected && !editing(el); })) changed(true);
    }, 0);
  });

  // --- the run's timeline --------------------------------------------------------------------

  function liveTimeline() {
    var timeline = document.getElementById("timeline");
    return timeline && timeline.dataset.live === "1" ? timeline : null;
  }

  function lastOn(timeline) {
    return parseInt(timeline.dataset.lastSequence, 10) || 0;
  }

  function addRow(timeline, row, sequence) {
    timeline.querySelector("#timeline-rows").appendChild(row);
    timeline.dataset.lastSequence = String(sequence);
    trim(timeline);
  }

  /* A page left open on a long run keeps its newest data-live-keep events (gaps marked before
     them included), not every event since it opened: the oldest rows go, and "← older" then leads
     to the page just before the first one kept, as a reload's pager would. */
  function trim(timeline) {
    var body = timeline.querySelector("#timeline-rows");
    var keep = parseInt(timeline.dataset.liveKeep, 10);
    if (!keep || body.children.length <= keep) return;  // at most as many events as rows: nothing to count
    var events = body.querySelectorAll("tr.event").length;
    if (events <= keep) return;
    while (events > keep && body.firstElementChild) {
      if (body.firstElementChild.classList.contains("event")) events--;
      body.removeChild(body.firstElementChild);
    }
    var first = body.querySelector("tr.event");
    if (first) olderThan(timeline, parseInt(first.dataset.sequence, 10));
  }

  function olderThan(timeline, first) {
    var size = Math.min(parseInt(timeline.dataset.pageSize, 10) || 1, first - 1);
    var url = timeline.dataset.tabUrl + "?after=" + (first - 1 - size) + "&limit=" + size;
    var pager = timeline.querySelector(".pager");
    var link = pager.querySelector("a.older");
    if (link && link.getAttribute("href") === url) return;
    var fresh = document.createElement("a");
    fresh.className = "older";
    fresh.id = "timeline-older";
    fresh.textContent = "← older";
    fresh.setAttribute("href", url);
    fresh.setAttribute("hx-get", url);
    fresh.setAttribute("hx-target", "#tab-panel");
    fresh.setAttribute("hx-push-url", "true");
    var focused = link && document.activeElement === link;
    if (link) pager.replaceChild(fresh, link); else pager.insertBefore(fresh, pager.firstChild);
    if (focused) fresh.focus({preventScroll: true});
    if (window.htmx) window.htmx.process(fresh);
  }

  function append(sequence, html) {
    var timeline = liveTimeline();
    if (!timeline) return;
    var last = lastOn(timeline);
    if (sequence <= last) return;  // a duplicate
    if (sequence > last + 1) {
      return catchUp(timeline).then(function () {
        if (sequence === lastOn(timeline) + 1) append(sequence, html);
      });
    }
    var template = document.createElement("template");
    template.innerHTML = html.trim();
    var row = template.content.firstElementChild;
    if (row) addRow(timeline, row, sequence);
  }

  /* Fill a gap from the database: the rows fragment, page after page, until nothing is missing. */
  function catchUp(timeline) {
    var url = timeline.dataset.rowsUrl + "?limit=1000&after=" + lastOn(timeline);
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
          if (sequence === lastOn(timeline) + 1) { addRow(timeline, row, sequence); added++; }
        });
        if (rows.length === 1000 && added > 0) return catchUp(timeline);
      });
  }

  // A timeline swapped in by a tab click may be behind what the socket already delivered.
  document.addEventListener("htmx:afterSettle", function () {
    var timeline = liveTimeline();
    if (timeline && received > lastOn(timeline)) {
      queue = queue.then(function () { return catchUp(timeline); }).catch(function () {});
    }
  });

  // --- start -----------------------------------------------------------------------------------

  window.runledgerLive = {
    get socket() { return socket; },
    get lastSequence() {
      var timeline = document.getElementById("timeline");
      return timeline ? lastOn(timeline) : received;
    },
    get refreshes() { return refreshes; },
    get unchanged() { return unchanged; },
    disconnect: function (ms) {
      var s = socket;
      socket = null;  // its close event is ours, not a drop to retry at once
      if (s) s.close();
      if (!finished) retry(ms || 0);
    },
  };

  function start() {
    root = document.querySelector("[data-live-socket]");
    if (!root || !("WebSocket" in window)) return;
    received = parseInt(root.dataset.liveAfter, 10) || 0;
    record();
    connect();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
