// The workspace's Settings pages: the retention form and the members' forms answer a refusal with
// 422 and their section again, with the reason; show it (htmx 2 does not swap error responses
// by default).
(function () {
  "use strict";
  document.addEventListener("htmx:beforeSwap", function (event) {
    var source = event.detail.elt;
    if (event.detail.xhr.status === 422 && source && source.closest && source.closest("#retention, #members")) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
})();
