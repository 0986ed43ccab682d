// Every <time datetime> shows UTC; hovering it tells the reader's local time (issue 13: "UTC
// times with the local time on hover"). Runs on load and on every htmx swap.
(function () {
  "use strict";
  function annotate(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      if (el.title) return;
      var moment = new Date(el.getAttribute("datetime"));
      if (!isNaN(moment)) el.title = "local time: " + moment.toLocaleString();
    });
  }
  document.addEventListener("DOMContentLoaded", function () { annotate(document); });
  document.addEventListener("htmx:afterSettle", function (event) { annotate(event.target); });
})();
