// The waterfall's geometry. The templates put each bar's offset and width (percent of the run's
// span) and each row's depth in data-* attributes, not style="…": the Content-Security-Policy
// allows no inline style. This applies them through the CSSOM (which the policy allows), on the
// page as loaded and on everything htmx swaps in (a tab, a sub-run's bars, a live update).
(function () {
  "use strict";
  function place(root) {
    if (!root || !root.querySelectorAll) return;
    var nodes = root.querySelectorAll("[data-left], [data-depth]");
    var all = root.matches && root.matches("[data-left], [data-depth]") ? [root] : [];
    for (var i = 0; i < nodes.length; i++) all.push(nodes[i]);
    all.forEach(function (node) {
      var d = node.dataset;
      if (d.left !== undefined) node.style.left = d.left + "%";
      if (d.width !== undefined) node.style.width = d.width + "%";
      if (d.depth !== undefined) node.style.setProperty("--depth", d.depth);
    });
  }
  place(document);
  document.addEventListener("htmx:load", function (event) { place(event.target); });
  document.addEventListener("DOMContentLoaded", function () { place(document); });
  window.runledgerPlace = place;
})();
